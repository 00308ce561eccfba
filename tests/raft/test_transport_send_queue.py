"""raft.transport's send queue: what a peer's socket does not take waits as the messages' own
buffers (issue 32: a bytearray that grew to a backed-up follower's 4 MiB was copied again at
each partial send, and its churn left the leader's heap fragmented). A socket that takes a
few bytes at a time, or none, and records what it took: the bytes leave whole and in order,
and the connection's count of unsent bytes (the leader's flow control reads it) is exact."""

from __future__ import annotations

import itertools
import os
from typing import Any

from raft.transport import PeerConnection


class _Poller:
    def subscribe(self, _fd: int, _callback: Any, _events: int) -> None:
        pass

    def unsubscribe(self, _fd: int) -> None:
        pass


class _SlowSocket:
    """Takes odd-sized pieces or nothing (would block), cycling; records what it took."""

    def __init__(self) -> None:
        self.taken = bytearray()
        self._takes = itertools.cycle([4_093, 0, 1, 17, 65_536, 10_007])

    def fileno(self) -> int:
        return 99

    def getpeername(self) -> tuple[str, int]:
        return ("127.0.0.1", 1)

    def sendmsg(self, buffers: Any) -> int:
        take = next(self._takes)
        if take == 0:
            raise BlockingIOError
        data = b"".join(bytes(b) for b in buffers)[:take]
        self.taken += data
        return len(data)


def test_unsent_bytes_are_counted_and_leave_whole_and_in_order() -> None:
    sock = _SlowSocket()
    connection = PeerConnection(_Poller(), b"k" * 32, "a:1", 5.0, 4096, 4096, sock=sock)  # type: ignore[arg-type]
    sent = bytearray()
    for k in range(40):  # header, body and tag of a frame, as `send` hands them over
        parts = (b"%08d" % k, os.urandom(1_000 + 997 * k), b"T" * 16)
        connection._write(*parts)
        sent += b"".join(parts)
        assert connection.getSendBufferSize() == len(sent) - len(sock.taken)
    assert 0 < connection.getSendBufferSize() < len(sent)
    for _ in range(10_000):
        if not connection.getSendBufferSize():
            break
        connection._flush()
        assert connection.getSendBufferSize() == len(sent) - len(sock.taken)
    assert bytes(sock.taken) == bytes(sent)
    assert not connection._wbuf
