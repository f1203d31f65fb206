"""A blocking facade over :class:`clients.client.SkewlessClient` for code without an event loop.

The async client runs on a private event loop in a daemon thread owned by the wrapper; every method hands a
coroutine to that loop and waits for its result. ``close()`` (or leaving the ``with`` block) stops the loop and
joins the thread.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Coroutine, Sequence
from concurrent.futures import Future as ConcurrentFuture
from types import TracebackType
from typing import Any, Generic, Never, NoReturn, ParamSpec, Self, TypeVar, Unpack, overload

from clients.client import SkewlessClient
from clients.options import ClientOptions, ConnectOptions
from clients.stats import ClientStats
from timesync.client import DEFAULT_COUNT
from timesync.clocks import ClockUs
from timesync.estimator import ClockEstimate

__all__ = ["SyncSkewlessClient", "connect_sync"]

T = TypeVar("T")
P = ParamSpec("P")


class _ClientAttribute(Generic[T]):
    """A read-only attribute of the wrapped async client, read as it is: a plain read, no coroutine, no thread hop."""

    def __set_name__(self, owner: type[Any], name: str) -> None:
        self._name = name

    @overload
    def __get__(self, wrapper: None, owner: type[Any] | None = None) -> Self: ...

    @overload
    def __get__(self, wrapper: SyncSkewlessClient, owner: type[Any] | None = None) -> T: ...

    def __get__(self, wrapper: SyncSkewlessClient | None, owner: type[Any] | None = None) -> Self | T:
        if wrapper is None:
            return self
        value: T = getattr(wrapper.client, self._name)
        return value

    def __set__(self, wrapper: SyncSkewlessClient, value: Never) -> NoReturn:
        raise AttributeError(f"{self._name!r} of a SyncSkewlessClient is read-only")


class SyncSkewlessClient:
    """``SkewlessClient`` with blocking methods; takes exactly the same arguments.

    ``send()`` costs a thread hop per event (tens of µs); ``send_many()`` sends a list in one hop.
    """

    def __init__(self, host: str, port: int, source_id: str, streams: Sequence[str],
                 **options: Unpack[ClientOptions]) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name=f"skewless-{source_id}", daemon=True)
        self._thread.start()
        self._stopped = False

        async def make() -> SkewlessClient:
            return SkewlessClient(host, port, source_id, streams, **options)

        try:
            self._client = self._run(make())
        except BaseException:
            self._stop_loop()
            raise

    def _run(self, coro: Coroutine[Any, Any, T], timeout_s: float | None = None) -> T:
        if self._stopped:
            coro.close()
            raise RuntimeError("client is closed")
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout_s)

    def _run_tracked(self, send_tracked: Callable[P, Coroutine[Any, Any, asyncio.Future[int]]], *args: P.args,
                     **kwargs: P.kwargs) -> ConcurrentFuture[int]:
        """One of the client's ``*_tracked`` sends, called on its loop; its delivery future as a thread-safe one."""

        async def submit() -> ConcurrentFuture[int]:
            return _concurrent(await send_tracked(*args, **kwargs))

        return self._run(submit())

    @property
    def client(self) -> SkewlessClient:
        """The async client (only touch it from its own loop thread)."""
        return self._client

    source_id = _ClientAttribute[str]()
    clock_us = _ClientAttribute[ClockUs]()
    unacked_count = _ClientAttribute[int]()
    stats = _ClientAttribute[ClientStats]()
    clock_estimate = _ClientAttribute[ClockEstimate | None]()

    def connect(self) -> None:
        self._run(self._client.connect())

    def send(self, stream: str, payload: Any, source_ts_us: int | None = None, *, seq: int | None = None) -> int:
        """Blocking ``send``: returns the seq; blocks while ``max_unacked`` events are outstanding."""
        return self._run(self._client.send(stream, payload, source_ts_us, seq=seq))

    def send_tracked(self, stream: str, payload: Any, source_ts_us: int | None = None, *,
                     seq: int | None = None) -> ConcurrentFuture[int]:
        """Blocking ``send_tracked``: returns a ``concurrent.futures.Future`` of the event's delivery (its seq once
        acked; ``EventRefused``, ``ClientClosed`` or the client's fatal error otherwise)."""
        return self._run_tracked(self._client.send_tracked, stream, payload, source_ts_us, seq=seq)

    def send_interval(self, stream: str, payload: Any, start_ts_us: int, end_ts_us: int, *,
                      seq: int | None = None) -> int:
        """Blocking ``send_interval``: an interval event sent once it ended; returns the seq."""
        return self._run(self._client.send_interval(stream, payload, start_ts_us, end_ts_us, seq=seq))

    def send_interval_start(self, stream: str, interval_id: str, payload: Any, source_ts_us: int | None = None, *,
                            seq: int | None = None) -> int:
        """Blocking ``send_interval_start``: the start endpoint of interval ``interval_id``; returns the seq."""
        return self._run(self._client.send_interval_start(stream, interval_id, payload, source_ts_us, seq=seq))

    def send_interval_end(self, stream: str, interval_id: str, payload: Any, source_ts_us: int | None = None, *,
                          seq: int | None = None) -> int:
        """Blocking ``send_interval_end``: the end endpoint of interval ``interval_id``; returns the seq."""
        return self._run(self._client.send_interval_end(stream, interval_id, payload, source_ts_us, seq=seq))

    def send_interval_tracked(self, stream: str, payload: Any, start_ts_us: int, end_ts_us: int, *,
                              seq: int | None = None) -> ConcurrentFuture[int]:
        """Blocking ``send_interval_tracked``: a ``concurrent.futures.Future`` of the interval's delivery."""
        return self._run_tracked(self._client.send_interval_tracked, stream, payload, start_ts_us, end_ts_us, seq=seq)

    def send_interval_start_tracked(self, stream: str, interval_id: str, payload: Any,
                                    source_ts_us: int | None = None, *,
                                    seq: int | None = None) -> ConcurrentFuture[int]:
        """Blocking ``send_interval_start_tracked``: a future of the start endpoint's delivery."""
        return self._run_tracked(self._client.send_interval_start_tracked, stream, interval_id, payload, source_ts_us,
                                 seq=seq)

    def send_interval_end_tracked(self, stream: str, interval_id: str, payload: Any,
                                  source_ts_us: int | None = None, *,
                                  seq: int | None = None) -> ConcurrentFuture[int]:
        """Blocking ``send_interval_end_tracked``: a future of the end endpoint's delivery."""
        return self._run_tracked(self._client.send_interval_end_tracked, stream, interval_id, payload, source_ts_us,
                                 seq=seq)

    def send_many(self, stream: str, payloads: Sequence[Any]) -> list[int]:
        """Send several events of one stream, stamped now, in one thread hop; returns their seqs."""

        async def many() -> list[int]:
            return [await self._client.send(stream, p) for p in payloads]

        return self._run(many())

    def flush(self, timeout_s: float = 30.0) -> None:
        self._run(self._client.flush(timeout_s))

    def close(self) -> None:
        if self._stopped:
            return
        try:
            self._run(self._client.close())
        finally:
            self._stop_loop()

    def _stop_loop(self) -> None:
        self._stopped = True
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        self._loop.close()

    def __enter__(self) -> Self:
        self.connect()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        try:
            if exc is None:
                self.flush()
        finally:
            self.close()


def _concurrent(future: asyncio.Future[T]) -> ConcurrentFuture[T]:
    """A thread-safe view of a loop future, settled from the loop's own thread when it is."""
    out: ConcurrentFuture[T] = ConcurrentFuture()

    def copy(done: asyncio.Future[T]) -> None:
        if done.cancelled():
            out.cancel()
        elif (exc := done.exception()) is not None:
            out.set_exception(exc)
        else:
            out.set_result(done.result())

    future.add_done_callback(copy)
    return out


def connect_sync(host: str, tcp_port: int, udp_port: int | None, source_id: str, sync_attempts: int = DEFAULT_COUNT,
                 *, streams: Sequence[str], **options: Unpack[ConnectOptions]) -> SyncSkewlessClient:
    """Blocking Sample Code 4.1: ``connect_sync("10.100.1.138", 9892, 7452, "Sensor1", 10, streams=["temps"])``."""
    client = SyncSkewlessClient(host, tcp_port, source_id, streams, udp_port=udp_port, sync_attempts=sync_attempts,
                                **options)
    try:
        client.connect()
    except BaseException:
        client.close()
        raise
    return client
