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
