"""The mark socket: the datagram socket a gate worker marks its timed windows on (gate/clock.py names the marks),
and the parent's end of it, where the kernel stamps each datagram with its send time and, where asked, its sender's
pid. The parent's own measure of a worker's windows: proc.Worker reads it."""

from __future__ import annotations

import socket
import struct

from tilesmith.gate.clock import LAYOUT_CHUNK

_SO_TIMESTAMPNS = getattr(socket, "SO_TIMESTAMPNS", 35)  # Linux's value where Python does not name it
_SO_PASSCRED, _SCM_CREDENTIALS = getattr(socket, "SO_PASSCRED", 16), getattr(socket, "SCM_CREDENTIALS", 2)


def pair():
    """(ours, theirs): a datagram socket pair whose receiving end gets each datagram's send time from the kernel
    (SO_TIMESTAMPNS): the parent's own measure of a worker's timed windows, which neither the worker's clock nor
    how soon the parent wakes can move. (None, None) where the platform cannot timestamp them."""
    try:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
    except (AttributeError, OSError):
        return None, None
    try:
        ours.setsockopt(socket.SOL_SOCKET, _SO_TIMESTAMPNS, 1)
        ours.setblocking(False)
    except OSError:
        ours.close()
        theirs.close()
        return None, None
    return ours, theirs


def passes_creds(sock) -> bool:
    """Ask the kernel for the sender's pid, as seen from here, on each datagram of `sock` (the process gate/freeze.py
    reads); False where it will not (no sample stops for that read then: a layout datagram without its sender is
    refused)."""
    try:
        sock.setsockopt(socket.SOL_SOCKET, _SO_PASSCRED, 1)
        return sock.getsockopt(socket.SOL_SOCKET, _SO_PASSCRED) == 1
    except OSError:
        return False


def receive(sock) -> tuple[bytes, int, int | None]:
    """One datagram off `sock`: (its bytes, the kernel's send time in ns or -1 where it has none, its sender's pid or
    None). Raises what recvmsg raises: BlockingIOError when none is queued, OSError when the socket is gone."""
    data, anc, _, _ = sock.recvmsg(LAYOUT_CHUNK + 64, socket.CMSG_SPACE(16) + socket.CMSG_SPACE(12))
    ts, pid = -1, None
    for level, kind, raw in anc:
        if level == socket.SOL_SOCKET and kind == _SO_TIMESTAMPNS and len(raw) >= 16:
            sec, ns = struct.unpack("qq", raw[:16])
            ts = sec * 1_000_000_000 + ns
        elif level == socket.SOL_SOCKET and kind == _SCM_CREDENTIALS and len(raw) >= 12:
            pid = struct.unpack("iII", raw[:12])[0]
    return data, ts, pid
