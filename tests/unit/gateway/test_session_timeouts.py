from contract.wire.frames import encode_frame
from gateway.session import CloseConnection, GatewaySession, SessionState, SessionTimeouts, TimeoutSweepClock

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



def test_a_sweep_judges_at_the_previous_sweeps_time():
    clock = TimeoutSweepClock()
    assert clock.judging_time(500_000) is None  # the first sweep judges nothing
    assert clock.judging_time(1_000_000) == 500_000
    assert clock.judging_time(4_000_000) == 1_000_000  # after a 3 s stall: judged as of before the stall


def test_a_hello_that_waited_out_the_gateways_stall_is_read_before_it_is_judged():
    """The shell's order around a 3 s stall of the gateway (handshake timeout 1 s): sweep at 0.5 s, the stall, the
    sweep at 3.5 s, then the hello that had waited in the socket since 0.1 s, then the sweep at 4 s. Judged at its
    own time the 3.5 s sweep would cut the peer off; judged at the previous sweep's, no sweep does."""
    clock = TimeoutSweepClock()
    session = GatewaySession(timeouts=SessionTimeouts(handshake_us=1_000_000), now_us=0)
    assert clock.judging_time(500_000) is None
    judged_us = clock.judging_time(3_500_000)
    assert judged_us == 500_000 and session.check_timeouts(judged_us) == []
    assert closed_with_timeout(GatewaySession(timeouts=SessionTimeouts(handshake_us=1_000_000), now_us=0)
                               .check_timeouts(3_500_000))  # what its own time would have said
    session.receive_data(HELLO, now_us=3_500_010)
    judged_us = clock.judging_time(4_000_000)
    assert judged_us == 3_500_000 and session.check_timeouts(judged_us) == []
    assert session.state is SessionState.STREAMING


def test_a_silent_peer_is_still_cut_off_one_sweep_later():
    clock = TimeoutSweepClock()
    session = GatewaySession(timeouts=SessionTimeouts(handshake_us=1_000_000), now_us=0)
    results = [session.check_timeouts(t) if (t := clock.judging_time(k * 500_000)) is not None else []
               for k in range(1, 5)]
    assert results[:3] == [[], [], []]  # judged as of 0.5, 1.0 s: within the timeout
    assert closed_with_timeout(results[3])  # the sweep at 2.0 s judges as of 1.5 s
