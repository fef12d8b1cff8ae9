"""tools/ports.py: broker ports come from below the kernel's ephemeral range, so a killed broker
restarted on its own ports never finds one taken by an outgoing connection (CI, 2026-11-29:
``test_duplicates_after_kill_9_stay_within_what_was_in_flight`` failed to restart broker B)."""

from __future__ import annotations

import socket

from tools.ports import ephemeral_low, free_port, free_ports


def test_ports_lie_below_the_ephemeral_range_and_do_not_repeat() -> None:
    low = ephemeral_low()
    picked = free_ports(4) + free_ports(4) + [free_port()]
    assert len(set(picked)) == len(picked)
    assert all(0 < port < low for port in picked), (picked, low)


def test_a_port_in_use_is_skipped() -> None:
    first = free_port()
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as holder:
        holder.bind(("127.0.0.1", first + 1))
        holder.listen()
        following = free_ports(2)
    assert first + 1 not in following


def test_an_outgoing_connection_never_takes_a_picked_port() -> None:
    """The failure this module prevents: a client's local port is chosen from the ephemeral range."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        clients = [socket.create_connection(server.getsockname()) for _ in range(20)]
        try:
            local_ports = {client.getsockname()[1] for client in clients}
        finally:
            for client in clients:
                client.close()
    assert all(port >= ephemeral_low() for port in local_ports)
    assert not local_ports & set(free_ports(8))
