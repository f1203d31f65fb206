"""The SDK's options are written once (clients.options.ClientSettings): the typed keywords, the client's signature
and docs/sdk.md's table name the same options, and bad values fail when the client is built."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import get_type_hints

import pytest

from clients import ClientOptions, SkewlessClient
from clients.options import ClientSettings

ROOT = Path(__file__).resolve().parents[3]


def test_the_typed_keywords_have_the_settings_names_and_types():
    assert get_type_hints(ClientOptions) == get_type_hints(ClientSettings)


def test_docs_table_lists_every_option_once():
    text = (ROOT / "docs" / "sdk.md").read_text()
    table = text[text.index("| option | default | meaning |"):]
    table = table[:table.index("\n\n")]
    names = [name for row in table.splitlines()[2:] for name in re.findall(r"`(\w+)`", row.split("|")[1])]
    assert sorted(names) == sorted(f.name for f in dataclasses.fields(ClientSettings))


@pytest.mark.parametrize(("options", "message"), [
    ({"batch_events": 0}, "batch_events must be >= 1"),
    ({"sync_attempts": 0}, "sync_attempts must be >= 1"),
    ({"token": "t", "hmac_secret": b"k"}, "pass either token or hmac_secret, not both"),
])
def test_bad_values_raise_value_error_from_the_client(options, message):
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        SkewlessClient("127.0.0.1", 9, "s1", ["a"], **options)


def test_an_unknown_option_is_a_type_error_naming_the_client():
    with pytest.raises(TypeError, match=r"^SkewlessClient\.__init__\(\) got an unexpected keyword argument "
                                        r"'pool_sise'$"):
        SkewlessClient("127.0.0.1", 9, "s1", ["a"], pool_sise=2)


def test_settings_are_frozen_and_gateways_normalized():
    client = SkewlessClient("127.0.0.1", 9, "s1", ["a"], gateways=[["10.0.0.2", "9892"]], pool_size=3)
    assert client.settings.gateways == (("10.0.0.2", 9892),)
    assert client.gateways == [("10.0.0.2", 9892)]
    assert client.settings.pool_size == 3 and client.settings.batch_events == 500
    with pytest.raises(dataclasses.FrozenInstanceError):
        client.settings.pool_size = 4
