"""The tests' and benchmarks' ports: free, and out of reach of the ports the OS hands out."""

import socket

from bench.procs import _ephemeral_low, free_port


def test_free_ports_are_bindable_distinct_and_below_the_ephemeral_range():
    ports = [free_port() for _ in range(50)]
    assert len(set(ports)) == len(ports)
    assert all(10000 <= p < _ephemeral_low() for p in ports), ports
    with socket.socket() as s:
        s.bind(("0.0.0.0", ports[0]))


def test_a_port_in_use_is_passed_over(monkeypatch):
    import random

    from bench import procs

    first = random.Random(7).randrange(10000, _ephemeral_low())
    with socket.socket() as held:
        held.bind(("0.0.0.0", first))
        held.listen()
        monkeypatch.setattr(procs, "_PICKER", random.Random(7))       # would pick `first` first
        assert procs.free_port() != first
