"""Ports for the servers tests start: always picked free by the kernel, never fixed, so two pytest-xdist
workers (or two sessions on one host) never ask for the same one."""

from __future__ import annotations

import socket


def free_port() -> int:
    """A TCP port on 127.0.0.1 with nothing listening on it now: the kernel's pick for port 0. Another
    process could take it between this probe and the caller's own bind; the kernel spreads its picks over
    the whole ephemeral range, so that stays rare enough for a test."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]
