"""Free 127.0.0.1 ports for servers this process starts (the cluster launcher, benchmarks,
tests), chosen below the kernel's ephemeral range.

A port from `bind(0)` lies inside the ephemeral range, and so do the source ports the kernel
hands to outgoing connections. While a freshly started server is still loading, nothing
listens on its port; a health poll whose source port happens to equal it connects to itself
(TCP simultaneous open), reads its own request back as the reply (`BadStatusLine: GET
/health HTTP/1.1`) and holds the port the server is about to bind. Ports below the range are
never handed out as source ports, so that cannot happen."""

from __future__ import annotations

import os
import socket

EPHEMERAL_RANGE_FILE = "/proc/sys/net/ipv4/ip_local_port_range"
LOWEST = 10000  # above the registered services people run on a development machine
STRIDE = 97


def ephemeral_low() -> int:
    """The first port of the kernel's ephemeral range (Linux's default 32768 elsewhere)."""
    try:
        with open(EPHEMERAL_RANGE_FILE) as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_ports(count: int = 1) -> int:
    """The first of `count` consecutive ports on 127.0.0.1 that bind now, all below the
    ephemeral range. The scan starts at an offset from the process id, so two processes
    picking at once rarely try the same run; a port is free only until someone binds it."""
    high = ephemeral_low() - count
    if high <= LOWEST:
        raise RuntimeError(f"no ports below the ephemeral range (it starts at {high + count}: {EPHEMERAL_RANGE_FILE})")
    span = high - LOWEST
    start = (os.getpid() * STRIDE) % span
    for step in range(0, span, STRIDE):
        base = LOWEST + (start + step) % span
        socks: list[socket.socket] = []
        try:
            for port in range(base, base + count):
                s = socket.socket()
                socks.append(s)
                s.bind(("127.0.0.1", port))
            return base
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise RuntimeError(f"no {count} consecutive free ports on 127.0.0.1 between {LOWEST} and {high + count}")


def free_port() -> int:
    """One free port on 127.0.0.1 below the ephemeral range."""
    return free_ports(1)
