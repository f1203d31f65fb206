import pytest

from contract.wire.frames import FrameDecoder, encode_frame
from gateway.auth import AuthenticationFailed, SourceAuthenticator, UnknownSource, hmac_token
from gateway.session import CloseConnection, GatewaySession, SendBytes, SourceRegistered

NOW_US = 1_800_000_000_000_000
SECRET = b"k" * 32


def test_open_gateway_accepts_anyone():
    SourceAuthenticator().check("anyone", None, NOW_US)


def test_static_token():
    auth = SourceAuthenticator(tokens={"s1": "tok-1"})
    auth.check("s1", "tok-1", NOW_US)
    with pytest.raises(AuthenticationFailed, match="wrong token"):
        auth.check("s1", "tok-2", NOW_US)
    with pytest.raises(AuthenticationFailed, match="credentials required"):
        auth.check("s1", None, NOW_US)
    with pytest.raises(UnknownSource, match="no credentials"):
        auth.check("s2", "tok-1", NOW_US)


def test_hmac_token_known_vector():
    # HMAC-SHA256(b"k"*32, "s1:5") computed independently with openssl:
    # printf 's1:5' | openssl dgst -sha256 -hmac kkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkk
    assert hmac_token(SECRET, "s1", 5) == "5:8308149faea0c9c1fa925f0b4c74e75c9056a526c6cd2bb3e9df12315ae4a949"


def test_hmac_accepts_fresh_and_refuses_stale_or_forged():
    auth = SourceAuthenticator(hmac_secret=SECRET, max_skew_us=1_000_000)
    auth.check("s1", hmac_token(SECRET, "s1", NOW_US - 999_999), NOW_US)
    with pytest.raises(AuthenticationFailed, match="too far"):
        auth.check("s1", hmac_token(SECRET, "s1", NOW_US - 1_000_001), NOW_US)
    with pytest.raises(AuthenticationFailed, match="wrong HMAC"):
        auth.check("s1", hmac_token(b"other", "s1", NOW_US), NOW_US)
    with pytest.raises(AuthenticationFailed, match="wrong HMAC"):
        auth.check("s2", hmac_token(SECRET, "s1", NOW_US), NOW_US)  # token of another source
    with pytest.raises(AuthenticationFailed, match="malformed"):
        auth.check("s1", "garbage", NOW_US)


def test_allowed_sources_refuse_unknown_ids():
    auth = SourceAuthenticator(allowed_sources={"s1"})
    auth.check("s1", None, NOW_US)
    with pytest.raises(UnknownSource, match="not registered"):
        auth.check("s9", None, NOW_US)


def test_session_refuses_unauthenticated_hello_with_error_frame():
    session = GatewaySession(authenticator=SourceAuthenticator(tokens={"s1": "t"}))
    hello = {"type": "hello", "version": 1, "source_id": "s1", "streams": ["a"], "token": "bad"}
    actions = session.receive_data(encode_frame(hello), NOW_US)
    assert not any(isinstance(a, SourceRegistered) for a in actions)
    (frame,) = [a for a in actions if isinstance(a, SendBytes)]
    assert FrameDecoder().feed(frame.data) == [
        {"type": "error", "code": "unauthenticated", "message": "source 's1': wrong token", "fatal": True}]
    assert isinstance(actions[-1], CloseConnection)


def test_hmac_token_is_accepted_once_and_forgotten_after_the_window():
    auth = SourceAuthenticator(hmac_secret=SECRET, max_skew_us=1_000_000)
    token = hmac_token(SECRET, "s1", NOW_US)
    auth.check("s1", token, NOW_US)
    with pytest.raises(AuthenticationFailed, match="already used"):
        auth.check("s1", token, NOW_US + 10)  # a captured hello, replayed
    auth.check("s2", hmac_token(SECRET, "s2", NOW_US), NOW_US)  # the same microsecond, another source: fine
    auth.check("s1", hmac_token(SECRET, "s1", NOW_US + 1), NOW_US + 10)
    # Once the timestamp is out of the window the clock check refuses it anyway, and the guard forgets it.
    later = NOW_US + 2_000_001
    auth.check("s1", hmac_token(SECRET, "s1", later), later)
    assert len(auth.replay_guard) == 1
    with pytest.raises(AuthenticationFailed, match="too far"):
        auth.check("s1", token, later)


# -- issue 24 item 8: one key per source ------------------------------------------------------------------------

MASTER = b"mastermastermastermastermaster00"


def test_a_source_key_is_the_hmac_of_its_id_under_the_master_known_vector():
    from gateway.auth import derive_source_key
    # printf 'skewless source key v1:victim' | openssl dgst -sha256 -hmac mastermastermastermastermaster00
    assert derive_source_key(MASTER, "victim") == "2baa25d926a1e434a26df5d032e3014facb87908c15743824470496ae3cacbee"


def test_the_sdk_derives_the_same_source_key_as_the_gateway():
    from clients.auth import derive_source_key as sdk_derive
    from gateway.auth import derive_source_key
    for source_id in ("victim", "forger", "ünïcode-id", "x" * 128):
        assert sdk_derive(MASTER, source_id) == derive_source_key(MASTER, source_id)


def test_with_a_master_secret_a_source_signs_only_as_itself():
    """c005711: one shared secret let any holder sign as any source id."""
    from gateway.auth import derive_source_key
    auth = SourceAuthenticator(hmac_master=MASTER)
    victim_key = derive_source_key(MASTER, "victim").encode()
    forger_key = derive_source_key(MASTER, "forger").encode()
    auth.check("victim", hmac_token(victim_key, "victim", NOW_US), NOW_US)
    auth.check("forger", hmac_token(forger_key, "forger", NOW_US), NOW_US)
    with pytest.raises(AuthenticationFailed, match="wrong HMAC"):
        auth.check("victim", hmac_token(forger_key, "victim", NOW_US + 1), NOW_US)
    with pytest.raises(AuthenticationFailed, match="wrong HMAC"):  # nor with the master itself
        auth.check("victim", hmac_token(MASTER, "victim", NOW_US + 2), NOW_US)


def test_a_key_table_gives_each_listed_source_its_own_key_and_refuses_the_others():
    auth = SourceAuthenticator(source_keys={"a": "key-of-a-0123456789", "b": "key-of-b-0123456789"})
    auth.check("a", hmac_token(b"key-of-a-0123456789", "a", NOW_US), NOW_US)
    with pytest.raises(AuthenticationFailed, match="wrong HMAC"):
        auth.check("b", hmac_token(b"key-of-a-0123456789", "b", NOW_US), NOW_US)
    with pytest.raises(UnknownSource, match="no credentials"):
        auth.check("c", hmac_token(b"key-of-a-0123456789", "c", NOW_US), NOW_US)


def test_the_key_table_wins_over_the_master():
    auth = SourceAuthenticator(hmac_master=MASTER, source_keys={"a": "rotated-key-of-a-0123"})
    auth.check("a", hmac_token(b"rotated-key-of-a-0123", "a", NOW_US), NOW_US)
    from gateway.auth import derive_source_key
    with pytest.raises(AuthenticationFailed, match="wrong HMAC"):
        auth.check("a", hmac_token(derive_source_key(MASTER, "a").encode(), "a", NOW_US + 1), NOW_US)


def test_skewless_keys_derive_prints_the_source_key(monkeypatch, capsys):
    from gateway.auth import derive_source_key
    from skewless.cli import main
    monkeypatch.setenv("SKEWLESS_HMAC_MASTER", MASTER.decode())
    with pytest.raises(SystemExit) as done:
        main(["keys", "derive", "--source", "victim"])
    assert done.value.code == 0
    assert capsys.readouterr().out == derive_source_key(MASTER, "victim") + "\n"
