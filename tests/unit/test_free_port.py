"""The tests' and benchmarks' ports: free, and out of reach of the ports the OS hands out."""

import socket

from testing.ports import ephemeral_low, free_port


def test_free_ports_are_bindable_distinct_and_below_the_ephemeral_range():
    ports = [free_port() for _ in range(50)]
    assert len(set(ports)) == len(ports)
    assert all(10000 <= p < ephemeral_low() for p in ports), ports
    with socket.socket() as s:
        s.bind(("0.0.0.0", ports[0]))


def test_a_port_in_use_is_passed_over(monkeypatch):
    import random

    from testing import ports

    first = random.Random(7).randrange(10000, ephemeral_low())
    with socket.socket() as held:
        held.bind(("0.0.0.0", first))
        held.listen()
        monkeypatch.setattr(ports, "_PICKER", random.Random(7))       # would pick `first` first
        assert ports.free_port() != first
