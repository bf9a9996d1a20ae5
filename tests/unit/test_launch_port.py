"""``semimig.launch.free_port``: a port that binds, drawn from below the kernel's ephemeral range.

Ports of the ephemeral range go to outgoing connections (gloo's pairs among them), so one picked
there could be taken before the store binds it (EADDRINUSE in the launch).  The
port must bind on the host asked for (IPv4 and IPv6), lie below the range where the kernel says
what the range is, and the caller's ``random`` state must not move.
"""
from __future__ import annotations

import random
import socket

import pytest

from semimig import launch


@pytest.mark.parametrize("host", ["127.0.0.1", "::1"])
def test_the_port_binds_below_the_ephemeral_range_and_leaves_random_alone(host):
    if host == "::1" and not socket.has_ipv6:
        pytest.skip("no IPv6 on this machine")
    low = launch._ephemeral_low()
    random.seed(7)
    expected = random.random()
    random.seed(7)
    ports = {launch.free_port(host) for _ in range(20)}
    assert random.random() == expected  # SystemRandom: the caller's stream is untouched
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    for port in ports:
        if low is not None:
            assert max(1024, low - 16384) <= port < low, (port, low)
        with socket.socket(family, socket.SOCK_STREAM) as sock:
            sock.bind((host, port))  # nobody holds it
    assert len(ports) > 1  # drawn at random, not one fixed port


def test_without_a_readable_range_the_kernel_picks(monkeypatch, tmp_path):
    monkeypatch.setattr(launch, "EPHEMERAL_RANGE_FILE", str(tmp_path / "missing"))
    assert launch._ephemeral_low() is None
    port = launch.free_port()
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", port))
    bad = tmp_path / "range"
    bad.write_text("not numbers\n")
    monkeypatch.setattr(launch, "EPHEMERAL_RANGE_FILE", str(bad))
    assert launch._ephemeral_low() is None
