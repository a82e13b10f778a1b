"""The local launcher's rendezvous port: free, and outside the range the kernel hands out to outgoing connections."""

from __future__ import annotations

import socket

from llmtrain.launch.backends import base


def test_the_port_is_free_and_below_the_ephemeral_range():
    low = base._ephemeral_start()
    ports = {base.free_port() for _ in range(20)}
    assert all(base.PORT_FLOOR <= p < low for p in ports), sorted(ports)
    assert len(ports) > 1  # drawn at random: two launches at once rarely meet
    for port in ports:
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))  # still free


def test_a_port_in_use_is_not_given(monkeypatch):
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        taken = held.getsockname()[1]
        held.listen()
        monkeypatch.setattr(base, "PORT_FLOOR", taken)
        monkeypatch.setattr(base, "_ephemeral_start", lambda: taken + 1000)
        assert all(base.free_port() != taken for _ in range(30))


def test_a_host_whose_ephemeral_range_starts_low_gets_a_kernel_port(monkeypatch):
    monkeypatch.setattr(base, "_ephemeral_start", lambda: 1024)
    port = base.free_port()
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))
