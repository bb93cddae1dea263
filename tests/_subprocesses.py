"""Helpers of the tests that start real processes (resume, several processes, evaluation)."""

import os
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


def xla_flags(**settings: object) -> str:
    """This process's `XLA_FLAGS` with each named flag replaced by `--name=value`, or dropped
    when the value is None (for the environment of a process a test starts)."""
    flags = [
        flag
        for flag in os.environ.get("XLA_FLAGS", "").split()
        if flag.lstrip("-").split("=")[0] not in settings
    ]
    flags += [f"--{name}={value}" for name, value in settings.items() if value is not None]
    return " ".join(flags)
