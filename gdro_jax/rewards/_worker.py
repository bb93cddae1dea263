"""The grading worker process: receives items on a socket, grades each on its main thread.

The parent starts it as a fresh interpreter, `python -m gdro_jax.rewards._worker FD`, with one end
of a socket pair inherited as file descriptor FD. That is what multiprocessing's "spawn" does
(fork and immediately exec, so nothing of the parent's threads is inherited), minus spawn's
re-import of the parent's `__main__`: a training script's imports (JAX, the model) are not
repeated in every worker, and scripts need no `if __name__ == "__main__"` guard.

Protocol (pickled messages over `multiprocessing.connection.Connection`):
  parent -> options dict, once;
  worker -> ("ready", pid) once math-verify is imported, or ("error", traceback) and exit;
  parent -> (index, completion, gold) per item, or None to stop;
  worker -> (index, status) per item, in the order received.

Each item runs under a soft timeout: an interval timer on this process's main thread raises
`_SoftTimeout` (a BaseException, so the `except Exception` clauses inside math-verify and sympy do
not swallow it) and the item is reported as a timeout while the worker lives on. Work that never
returns to the interpreter (a long C-level big-integer operation) does not see the signal; the
parent's hard deadline kills and replaces the worker then.
"""

from __future__ import annotations

import os
import signal
import sys
import traceback
from multiprocessing.connection import Connection

from gdro_jax.rewards import _verify


class _SoftTimeout(BaseException):
    """Raised by the interval timer when an item overruns its soft timeout."""


def _on_alarm(signum, frame):
    raise _SoftTimeout()


def _limit_memory(memory_limit_mb: int | None) -> None:
    if memory_limit_mb is None:
        return
    import resource

    limit = memory_limit_mb * 2**20
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    if hard != resource.RLIM_INFINITY:
        limit = min(limit, hard)
    resource.setrlimit(resource.RLIMIT_AS, (limit, hard))


def _grade(completion: str, gold: str, options: dict) -> str:
    soft_timeout_s = options["soft_timeout_s"]
    try:
        if soft_timeout_s is not None:
            signal.setitimer(signal.ITIMER_REAL, soft_timeout_s)
        try:
            grade = _verify.grade_completion(
                completion, gold, fallback_patterns=options["fallback_patterns"]
            )
            return grade.status
        finally:
            if soft_timeout_s is not None:
                signal.setitimer(signal.ITIMER_REAL, 0)
    except _SoftTimeout:
        return _verify.TIMEOUT
    except Exception:  # A bug or a MemoryError outside math-verify: this item, not the worker.
        return _verify.CRASH


def serve(connection: Connection) -> None:
    """The worker's main loop: read the options, report ready, grade items until told to stop.

    Args:
      connection: the worker's end of the socket pair. The first message is the options dict:
        `fallback_patterns`, `soft_timeout_s` (None: no soft timeout) and `memory_limit_mb`
        (None: unlimited address space).
    """
    # Ctrl-C goes to the whole process group; the parent decides when workers stop.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        options = connection.recv()
        _limit_memory(options["memory_limit_mb"])
        _verify.quiet_math_verify()
        signal.signal(signal.SIGALRM, _on_alarm)
        # Import math-verify, sympy and the LaTeX parser before reporting ready, so the first
        # item's timeout is not spent on imports.
        _verify.grade_completion("\\boxed{\\frac{1}{2}}", "0.5")
    except BaseException:
        connection.send(("error", traceback.format_exc()))
        return
    connection.send(("ready", os.getpid()))
    while True:
        try:
            message = connection.recv()
        except (EOFError, OSError):
            return
        if message is None:
            return
        index, completion, gold = message
        connection.send((index, _grade(completion, gold, options)))


if __name__ == "__main__":
    serve(Connection(int(sys.argv[1])))
