"""Ports for the servers we start lie below the ephemeral range, where a health poll cannot
be handed the server's own port as its source port and connect to itself."""

from __future__ import annotations

import socket

from agentkv.commands.ports import ephemeral_low, free_ports


def test_a_run_of_free_ports_lies_below_the_ephemeral_range_and_binds() -> None:
    base = free_ports(4)
    assert base + 4 <= ephemeral_low()
    socks = [socket.socket() for _ in range(4)]
    try:
        for offset, s in enumerate(socks):
            s.bind(("127.0.0.1", base + offset))
    finally:
        for s in socks:
            s.close()


def test_a_connection_whose_source_port_is_its_destination_reads_its_own_request() -> None:
    """The failure the range avoids (CI once read `BadStatusLine: GET /health HTTP/1.1`):
    with nothing listening on a port, a client bound to that same port connects to itself."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with socket.socket() as client:
        client.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        client.bind(("127.0.0.1", port))
        client.settimeout(5)
        client.connect(("127.0.0.1", port))
        client.sendall(b"GET /health HTTP/1.1\r\n\r\n")
        assert client.recv(64).startswith(b"GET /health")
