"""Helpers of the tests that start real processes (resume, several processes, evaluation)."""

import socket
import subprocess


def free_port() -> int:
    """A TCP port free on this machine now (for a `jax.distributed` coordinator)."""
    with socket.socket() as sock:
        sock.bind(("localhost", 0))
        return sock.getsockname()[1]


def finish(process: subprocess.Popen, timeout_s: float) -> int:
    """Waits for `process` up to `timeout_s`; kills it if it is still running (on a timeout or
    any error), and returns its exit code."""
    try:
        process.wait(timeout=timeout_s)
    finally:
        stop(process)
    return process.returncode


def stop(process: subprocess.Popen) -> None:
    """Kills `process` if it is still running, and reaps it."""
    if process.poll() is None:
        process.kill()
        process.wait()
