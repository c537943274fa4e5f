"""Free ports come from below the kernel's ephemeral range, where no outgoing connection can take them first."""

from __future__ import annotations

import socket

import pytest

from forge_replay.runtime import ports


def _range_file(tmp_path, first: int, last: int) -> str:
    path = tmp_path / "ip_local_port_range"
    path.write_text(f"{first}\t{last}\n")
    return str(path)


def test_ports_are_distinct_free_and_below_this_machines_ephemeral_range():
    ephemeral = ports.ephemeral_range()
    if ephemeral is None:
        pytest.skip("no /proc/sys/net/ipv4/ip_local_port_range here")
    picked = ports.free_ports(9, "127.0.0.1")
    assert len(set(picked)) == 9
    assert all(ports.FIRST_PORT <= port < ephemeral[0] for port in picked), (picked, ephemeral)
    for port in picked:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", port))


def test_a_port_someone_listens_on_is_never_picked(tmp_path):
    # The smallest range allowed, nine ports in ten of it taken: a pick that skipped the bind check would land on one.
    path = _range_file(tmp_path, ports.FIRST_PORT + 1000, 65535)
    listeners = []
    try:
        for port in range(ports.FIRST_PORT, ports.FIRST_PORT + 1000):
            if port % 10 == 0:
                continue
            sock = socket.socket()
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:  # already someone else's: taken all the same
                sock.close()
                continue
            listeners.append(sock)
        taken = {sock.getsockname()[1] for sock in listeners}
        assert len(taken) > 800
        picked = ports.free_ports(5, "127.0.0.1", path=path)
        assert len(set(picked)) == 5 and not taken & set(picked), picked
    finally:
        for sock in listeners:
            sock.close()


def test_an_unreadable_or_too_small_range_falls_back_to_the_kernels_choice(tmp_path):
    assert ports.listening_ports(str(tmp_path / "missing")) is None
    too_small = _range_file(tmp_path, ports.FIRST_PORT + 10, 65535)
    assert ports.listening_ports(too_small) is None
    picked = ports.free_ports(3, "127.0.0.1", path=too_small)
    assert len(set(picked)) == 3 and all(0 < port < 65536 for port in picked)


def test_the_range_is_read_from_the_kernels_file(tmp_path):
    path = _range_file(tmp_path, 40000, 60999)
    assert ports.ephemeral_range(path) == (40000, 60999)
    assert ports.listening_ports(path) == range(ports.FIRST_PORT, 40000)
