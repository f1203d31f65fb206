import uuid

import pytest

from broker import launcher as kafka_broker


def test_cluster_id_never_starts_with_a_dash(monkeypatch: pytest.MonkeyPatch) -> None:
    # 0xF8 as the first byte encodes to "-" in url-safe base64; the launcher must redraw it.
    drawn = iter([uuid.UUID(bytes=b"\xf8" + b"\x00" * 15), uuid.UUID(bytes=b"\x10" * 16)])
    monkeypatch.setattr(kafka_broker.uuid, "uuid4", lambda: next(drawn))
    assert kafka_broker._kafka_cluster_id() == "EBAQEBAQEBAQEBAQEBAQEA"


def test_cluster_id_is_kafka_uuid_text() -> None:
    ids = {kafka_broker._kafka_cluster_id() for _ in range(2000)}
    assert len(ids) == 2000
    assert all(len(i) == 22 and not i.startswith("-") for i in ids)


def test_restart_needs_a_broker_this_object_started(tmp_path) -> None:
    with pytest.raises(kafka_broker.BrokerError, match="nothing to restart"):
        kafka_broker.KafkaBroker(tmp_path).restart()
