"""Preemption: SIGTERM or Ctrl-C finish the step in flight, save it, then stop the run.

`train` runs its loop inside `stop_on_signals()`; when a signal arrives it saves a checkpoint of
the step just finished and raises `TrainingInterrupted`, which the entry point turns into exit
status 128 + the signal number.
"""

from __future__ import annotations

import contextlib
import signal
import threading

from gdro_jax.runtime import notice


class TrainingInterrupted(KeyboardInterrupt):
    """`train` stopped on SIGTERM or SIGINT after finishing (and checkpointing) the step in flight.

    A `KeyboardInterrupt`, so code that lets Ctrl-C through lets this through too.

    Attributes:
      step: the completed steps when it stopped.
      signum: the signal received.
      path: the checkpoint saved at `step`, or None when checkpoints are disabled.
      steps: the run's `config.steps` (None when not given).
    """

    def __init__(self, step: int, signum: int, path: str | None, steps: int | None = None):
        of = f" of {steps}" if steps is not None else ""
        where = f"checkpoint saved in {path}" if path else "checkpoints are disabled: nothing saved"
        super().__init__(f"{signal.Signals(signum).name}: stopped after step {step}{of}; {where}")
        self.step, self.signum, self.path, self.steps = step, signum, path, steps


class StopRequest:
    """Set by `stop_on_signals`: `signum` is the first stop signal received, else None.

    The loop sets `step`, the step in flight, and `steps`, the run's last step, and reads the
    request with `poll()` once per step, after the step's work. The signal's notice names the step
    the run stops after, and `poll()` keeps that promise: a signal that arrives after step `s` was
    polled stops the run after step `s + 1`.
    """

    def __init__(self):
        self.signum: int | None = None
        self.step: int | None = None
        self.steps: int | None = None
        self.stop_after: int | None = None  # the step the notice named
        self._polled: int | None = None

    def poll(self) -> int | None:
        """The stop signal, if the run is to stop after the step in flight; else None."""
        # Marked first, then read: a handler that runs in between has already named the next step.
        self._polled = self.step
        if self.signum is None or (self.stop_after is not None and self.stop_after > self.step):
            return None
        return self.signum

    def _request(self, signum: int) -> str:
        """Records the first signal; returns what the run finishes before it stops."""
        self.signum = signum
        if self.step is None:
            return "the current step"
        self.stop_after = self.step + (self._polled == self.step)
        if self.steps is not None and self.stop_after > self.steps:
            return "the run"
        return f"step {self.stop_after}"


@contextlib.contextmanager
def stop_on_signals(signums: tuple[int, ...] = (signal.SIGTERM, signal.SIGINT)):
    """Turns the first SIGTERM/SIGINT into a request to stop after the current step.

    A second signal raises `KeyboardInterrupt` at once. Outside the main thread (where Python
    cannot install handlers) the request is never set and the signals keep their handlers.

    Yields:
      A `StopRequest`.
    """
    request = StopRequest()
    if threading.current_thread() is not threading.main_thread():
        yield request
        return

    def handler(signum, frame):
        del frame
        if request.signum is not None:
            raise KeyboardInterrupt(f"{signal.Signals(signum).name} received twice")
        finishing = request._request(signum)
        notice(
            f"{signal.Signals(signum).name} received: finishing {finishing} and saving a "
            "checkpoint (send it again to stop at once)"
        )

    previous = {signum: signal.signal(signum, handler) for signum in signums}
    try:
        yield request
    finally:
        for signum, old in previous.items():
            signal.signal(signum, old)
