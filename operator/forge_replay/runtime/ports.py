"""Free TCP ports for the servers a run starts (engines, the router, the rendezvous, a local Ray head).

A port found by binding port 0 comes from the kernel's ephemeral range, the same range every outgoing connection
draws its local port from: between the probe and the server's own bind, a connection (Ray's, an HTTP client's) can
take it, and the server fails with EADDRINUSE (seen in CI). So ports are picked at random *below* that range and
above Ray's worker ports, where only a server that was told the port listens, and each is checked by binding it.
Where that range is unknown or too small, binding port 0 is the fallback.
"""

from __future__ import annotations

import random
import socket

EPHEMERAL_RANGE_FILE = "/proc/sys/net/ipv4/ip_local_port_range"
FIRST_PORT = 20000
"""Above Ray's worker ports (``ray start --max-worker-port`` defaults to 19999) and the well-known ones."""
_MIN_SPAN = 1000
_TRIES = 200


def ephemeral_range(path: str = EPHEMERAL_RANGE_FILE) -> tuple[int, int] | None:
    """The kernel's ephemeral port range (first, last), or None where it cannot be read (not Linux)."""
    try:
        with open(path, encoding="ascii") as handle:
            first, last = (int(value) for value in handle.read().split())
    except (OSError, ValueError):
        return None
    return first, last


def listening_ports(path: str = EPHEMERAL_RANGE_FILE) -> range | None:
    """The ports picked from: FIRST_PORT up to the ephemeral range, or None where that leaves too few."""
    ephemeral = ephemeral_range(path)
    if ephemeral is None or ephemeral[0] - FIRST_PORT < _MIN_SPAN:
        return None
    return range(FIRST_PORT, ephemeral[0])


def _bindable(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def _kernel_port(host: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def free_ports(count: int, host: str = "", *, path: str = EPHEMERAL_RANGE_FILE) -> list[int]:
    """``count`` distinct TCP ports free right now on ``host`` ("" = every interface), outside the ephemeral range."""
    ports: list[int] = []
    pool = listening_ports(path)
    if pool is not None:
        for port in random.sample(pool, min(_TRIES, len(pool))):
            if port not in ports and _bindable(host, port):
                ports.append(port)
                if len(ports) == count:
                    return ports
    while len(ports) < count:
        port = _kernel_port(host)
        if port not in ports:
            ports.append(port)
    return ports


def free_port(host: str = "", *, path: str = EPHEMERAL_RANGE_FILE) -> int:
    """One TCP port free right now on ``host``, outside the ephemeral range (see the module's docstring)."""
    return free_ports(1, host, path=path)[0]
