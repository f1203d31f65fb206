from contract.wire.frames import encode_frame
from gateway.session import CloseConnection, GatewaySession, SessionState, SessionTimeouts

TIMEOUTS = SessionTimeouts(handshake_us=1_000, partial_frame_us=5_000, idle_us=20_000)
HELLO = encode_frame({"type": "hello", "version": 1, "source_id": "s", "streams": ["a"]})
HEARTBEAT = encode_frame({"type": "heartbeat", "source_ts_us": 1, "next_seq": {"a": 0}})


def closed_with_timeout(actions):
    return bool(actions) and isinstance(actions[-1], CloseConnection) and actions[-1].error_code == "timeout"


def test_no_hello_in_time():
    session = GatewaySession(timeouts=TIMEOUTS, now_us=100)
    assert session.check_timeouts(1_100) == []
    assert closed_with_timeout(session.check_timeouts(1_101))
    assert session.state is SessionState.ERROR


def test_slowloris_partial_frame():
    session = GatewaySession(timeouts=TIMEOUTS, now_us=0)
    session.receive_data(HELLO, now_us=10)
    # One byte of the next frame every 1 ms: each byte is activity, but the frame never completes.
    for t in range(0, 5_001, 1_000):
        session.receive_data(HEARTBEAT[t // 1_000:t // 1_000 + 1], now_us=20 + t)
        assert session.check_timeouts(20 + t) == []
    assert closed_with_timeout(session.check_timeouts(5_021))


def test_completed_frame_clears_the_partial_timer():
    session = GatewaySession(timeouts=TIMEOUTS, now_us=0)
    session.receive_data(HELLO, now_us=0)
    session.receive_data(HEARTBEAT[:3], now_us=100)
    session.receive_data(HEARTBEAT[3:], now_us=4_000)
    assert session.check_timeouts(9_000) == []


def test_idle_connection_closed_and_heartbeat_keeps_it_alive():
    session = GatewaySession(timeouts=TIMEOUTS, now_us=0)
    session.receive_data(HELLO, now_us=0)
    session.receive_data(HEARTBEAT, now_us=15_000)
    assert session.check_timeouts(35_000) == []
    assert closed_with_timeout(session.check_timeouts(35_001))
