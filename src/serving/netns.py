"""Keep a local Ray Serve runtime off the network: a private network namespace.

Ray Serve replicas open an internal gRPC port on every interface (hard-coded in Ray 2.60; see
the platform notes), even when HTTP and Ray's core services are bound to 127.0.0.1. Tests and
the load benchmark therefore move their process into a fresh network namespace (only a
loopback device) *before* starting Ray: every Ray process they spawn inherits it, so nothing
is reachable from outside. This needs CAP_SYS_ADMIN (root or `unshare -rn`); where it is not
allowed, `enter_private_netns` returns False and the caller runs normally (HTTP still bound to
127.0.0.1) — the reason is in `last_error`.
"""

from __future__ import annotations

import ctypes
import fcntl
import os
import socket
import struct
import threading

CLONE_NEWNET = 0x40000000
ENV_FLAG = "RAGPILOT_PRIVATE_NETNS"
last_error: str = ""


def in_private_netns() -> bool:
    return os.environ.get(ENV_FLAG) == "1"


def enter_private_netns() -> bool:
    """Move this thread (and every process it starts afterwards) into a new network namespace
    with loopback up. Call from the main thread before any Ray/socket work. Idempotent."""
    global last_error
    if in_private_netns():
        return True
    if os.environ.get("RAGPILOT_NO_NETNS") == "1":
        last_error = "disabled by RAGPILOT_NO_NETNS=1"
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        old_ns = os.open(f"/proc/self/task/{threading.get_native_id()}/ns/net", os.O_RDONLY)
    except OSError as exc:
        last_error = f"{type(exc).__name__}: {exc}"
        return False
    try:
        if libc.unshare(CLONE_NEWNET) != 0:
            last_error = f"unshare(CLONE_NEWNET): {os.strerror(ctypes.get_errno())}"
            return False
        try:
            _loopback_up()
        except OSError as exc:
            last_error = f"bringing lo up: {exc}"
            libc.setns(old_ns, CLONE_NEWNET)  # back to where we were
            return False
    finally:
        os.close(old_ns)
    os.environ[ENV_FLAG] = "1"
    return True


def _loopback_up() -> None:
    """`ip link set lo up` without needing iproute2: SIOCGIFFLAGS / SIOCSIFFLAGS."""
    siocgifflags, siocsifflags, iff_up = 0x8913, 0x8914, 0x1
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        ifr = fcntl.ioctl(s, siocgifflags, struct.pack("16sh", b"lo", 0))
        flags = struct.unpack("16sh", ifr[:18])[1]
        fcntl.ioctl(s, siocsifflags, struct.pack("16sh", b"lo", flags | iff_up))


FREE_PORTS = (20000, 29999)
"""Where `free_port` looks: below the kernel's ephemeral range (32768-60999 by default), above
Ray's worker ports (10002-19999) and below the replica ports of Serve's HAProxy mode
(30000-31000)."""


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nobody uses right now, for a server this process starts next (tests and
    benchmarks). Not one the kernel hands out for port 0: those come from the ephemeral range,
    where every outgoing connection also takes its local port, and Ray opens many while it
    starts, so such a port could be taken before Serve binds it ("Failed to bind to address
    127.0.0.1:35267" in a CI run). A random free port of `FREE_PORTS` instead; two callers can
    still race for one port (1 in 10,000)."""
    import random

    rng = random.Random()  # never the seeded global generator
    lo, hi = FREE_PORTS
    for _ in range(200):
        port = rng.randint(lo, hi)
        with socket.socket() as s:
            try:
                s.bind((host, port))
            except OSError:
                continue
            return port
    with socket.socket() as s:  # the range is full: the kernel's choice, race and all
        s.bind((host, 0))
        return int(s.getsockname()[1])
