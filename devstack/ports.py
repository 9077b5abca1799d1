"""Ports for the servers the stack starts, chosen before the server binds them.

A port from a bind to port 0 lies in the kernel's ephemeral range, where every outgoing
connection takes its local port: between the choice and the server's own bind, another
connection (of this process or of a test process beside it) may take it, and the server
fails to start. Ports below that range are never handed out that way, so they are chosen
there, at random (a system source: tests may seed `random`), each one bound once to check it.
"""

from __future__ import annotations

import random
import socket
from pathlib import Path

EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
LOWEST = 10_000
"""Below this, ports are left to the services a machine runs on well-known ones."""
_chooser = random.SystemRandom()


def _below_ephemeral() -> range | None:
    try:
        low = int(EPHEMERAL_RANGE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    return range(LOWEST, low) if low - LOWEST >= 1_000 else None


def free_ports(count: int, host: str = "127.0.0.1") -> list[int]:
    """`count` distinct ports nothing listens on right now (held open together, then released)."""
    sockets: list[socket.socket] = []
    pool = _below_ephemeral()
    candidates = _chooser.sample(pool, min(len(pool), 20 * count)) if pool else []
    try:
        for port in candidates:
            if len(sockets) == count:
                break
            sock = socket.socket()
            try:
                sock.bind((host, port))
            except OSError:
                sock.close()
                continue
            sockets.append(sock)
        while len(sockets) < count:  # no room below the ephemeral range: the kernel's choice
            sock = socket.socket()
            sockets.append(sock)
            sock.bind((host, 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for sock in sockets:
            sock.close()


def free_port(host: str = "127.0.0.1") -> int:
    return free_ports(1, host)[0]
