"""`MathGrader`: math-verify grading in a pool of worker processes with a hard per-item timeout.

Why processes: math-verify bounds its own work with `signal.alarm`, which only works on a main
thread, and a sympy blow-up or a C-level hang can take unbounded time or memory. Each worker
(`_worker.py`) grades on its own main thread; the parent never blocks on one item:

- Start: each worker is a fresh interpreter (`python -m gdro_jax.rewards._worker`, fork and
  exec as multiprocessing's "spawn" does; never a bare `fork` of the parent, which is typically a
  multithreaded JAX process). Unlike "spawn" it does not re-import the parent's `__main__`, so a
  worker costs the import of math-verify (about a second), not of the training script. Each
  reports ready once imported; an item's clock starts only once its worker is ready.
- Bounded queue: the parent pulls items lazily from the input and keeps at most
  `max_in_flight` items queued at each worker, so memory stays bounded for any input size.
- Timeouts: a worker stops an item at `timeout_s` itself (soft, the worker lives on). The parent
  kills (SIGKILL) a worker whose current item has run `timeout_s + kill_grace_s` and starts a
  replacement; items queued behind it are re-sent to the pool. Either way the item scores 0.0 and
  counts as a timeout.
- Crashes: a worker that dies (killed, segfault, out of memory) is replaced; the item it was on
  scores 0.0 and counts as a crash, its queued items are re-sent. A worker found dead while idle
  is replaced before the next item.

Each item's `Grade` has a status in `("correct", "wrong", "no_answer", "timeout", "crash")`;
`MathGrader.stats` counts them over the grader's life, with the number of worker restarts.

Over 400 lines on purpose: the worker pool's protocol, timeouts and replacement of dead or stuck
workers are one state machine; the worker side is `_worker.py`.
"""

from __future__ import annotations

import collections
import dataclasses
import os
import re
import socket
import subprocess
import sys
import time
import weakref
from collections.abc import Iterable, Sequence
from multiprocessing.connection import Connection, wait
from pathlib import Path
from typing import NamedTuple

from tqdm.auto import tqdm

from gdro_jax.rewards import _verify
from gdro_jax.rewards._extract import ANSWER_LINE_PATTERNS
from gdro_jax.rewards._verify import CRASH, TIMEOUT, Grade

_MAX_STARTUP_FAILURES = 3
# gdro_jax/rewards/_grader.py -> parents[2] holds the gdro_jax package.
_PACKAGE_ROOT = Path(__file__).resolve().parents[2]


class GraderStats(NamedTuple):
    """Counts over a grader's life (all `int`)."""

    items: int  # items graded
    correct: int
    wrong: int
    no_answer: int  # no final answer found in the completion
    timeouts: int  # items stopped at the per-item timeout (soft or hard)
    crashes: int  # items lost to a dying worker or an error in grading
    restarts: int  # workers replaced (after a kill, a crash, or found dead)


@dataclasses.dataclass(eq=False)
class _Slot:
    """One worker process and the items queued at it (parent side)."""

    process: subprocess.Popen
    connection: Connection
    started_at: float  # time.monotonic() at start
    ready: bool = False
    queued: collections.deque = dataclasses.field(default_factory=collections.deque)  # indices
    head_since: float = 0.0  # when the first queued item became the one being graded


def _stop_slots(slots: list[_Slot]) -> None:
    """Stops every worker: asks politely, then kills. Safe to call twice."""
    for slot in slots:
        if not slot.ready:  # still importing: nothing to finish
            slot.process.kill()
            continue
        try:
            slot.connection.send(None)
        except (OSError, ValueError):
            pass
    deadline = time.monotonic() + 1.0
    for slot in slots:
        try:
            slot.process.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            slot.process.kill()
            slot.process.wait()
        slot.connection.close()
    slots.clear()


class MathGrader:
    """Grades (completion, gold) pairs with math-verify in worker processes.

    Use as a context manager, or call `close()`:

        with rewards.MathGrader(num_workers=2, timeout_s=5.0) as grader:
            scores = grader.grade(completions, golds)      # list[float], 1.0 or 0.0
            print(grader.stats.timeouts, grader.stats.crashes)
    """

    def __init__(
        self,
        num_workers: int = 2,
        timeout_s: float = 5.0,
        *,
        max_in_flight: int = 1,
        kill_grace_s: float = 1.0,
        soft_timeout: bool = True,
        fallback_patterns: Sequence[re.Pattern] = ANSWER_LINE_PATTERNS,
        memory_limit_mb: int | None = 4096,
        startup_timeout_s: float = 120.0,
        progress: bool = False,
    ):
        """Starts the workers (without waiting for them to be ready).

        Args:
          num_workers: worker processes.
          timeout_s: per-item time limit in seconds.
          max_in_flight: items queued at each worker at once (the bounded queue). More than 1
            hides the round trip between items, but an item queued behind a slow one waits for
            it (up to `timeout_s`); at about 1 ms per item the round trip is small.
          kill_grace_s: with `soft_timeout`, the parent kills a worker at `timeout_s +
            kill_grace_s` if the worker's own timer did not stop the item.
          soft_timeout: let workers stop an overrunning item themselves (cheap: no restart);
            False leaves only the parent's kill at `timeout_s`.
          fallback_patterns: answer patterns tried when a completion has no `\\boxed{}` (see
            `extract_answer`); `()` disables them.
          memory_limit_mb: address-space limit of each worker (RLIMIT_AS), so a runaway sympy
            expression fails instead of exhausting the machine; None: no limit.
          startup_timeout_s: how long a worker may take to import math-verify.
          progress: default for `grade(..., progress=...)`: show a tqdm bar.

        Raises:
          ValueError: naming the first invalid argument.
        """
        if num_workers < 1:
            raise ValueError(f"num_workers must be >= 1, got num_workers={num_workers}")
        if not timeout_s > 0:
            raise ValueError(f"timeout_s must be > 0, got timeout_s={timeout_s}")
        if max_in_flight < 1:
            raise ValueError(f"max_in_flight must be >= 1, got max_in_flight={max_in_flight}")
        if kill_grace_s < 0:
            raise ValueError(f"kill_grace_s must be >= 0, got kill_grace_s={kill_grace_s}")
        if memory_limit_mb is not None and memory_limit_mb < 256:
            raise ValueError(
                f"memory_limit_mb must be >= 256 or None, got memory_limit_mb={memory_limit_mb}"
            )
        if not startup_timeout_s > 0:
            raise ValueError(f"startup_timeout_s must be > 0, got {startup_timeout_s=}")
        self.num_workers = num_workers
        self.timeout_s = float(timeout_s)
        self.max_in_flight = max_in_flight
        self.progress = progress
        self._hard_timeout_s = self.timeout_s + (kill_grace_s if soft_timeout else 0.0)
        self._startup_timeout_s = startup_timeout_s
        self._options = dict(
            fallback_patterns=tuple(fallback_patterns),
            soft_timeout_s=self.timeout_s if soft_timeout else None,
            memory_limit_mb=memory_limit_mb,
        )
        self._counts = collections.Counter()
        self._restarts = 0
        self._startup_failures = 0
        self._slots: list[_Slot] = [self._start_worker() for _ in range(num_workers)]
        self._finalizer = weakref.finalize(self, _stop_slots, self._slots)

    # ---- worker lifecycle ----------------------------------------------------------------------

    def _start_worker(self) -> _Slot:
        parent_end, child_end = socket.socketpair()
        environment = dict(os.environ)
        # Run the same gdro_jax as the parent, whatever the child's sys.path would find first.
        environment["PYTHONPATH"] = os.pathsep.join(
            filter(None, [str(_PACKAGE_ROOT), environment.get("PYTHONPATH")])
        )
        process = subprocess.Popen(
            [sys.executable, "-m", "gdro_jax.rewards._worker", str(child_end.fileno())],
            pass_fds=[child_end.fileno()],
            stdin=subprocess.DEVNULL,
            env=environment,
        )
        # Close our copy of the child's end, so the worker's death reads as EOF here.
        child_end.close()
        connection = Connection(parent_end.detach())
        connection.send(self._options)
        return _Slot(process, connection, time.monotonic())

    def _replace(self, position: int) -> None:
        slot = self._slots[position]
        if slot.process.poll() is None:
            slot.process.kill()
        slot.process.wait()
        slot.connection.close()
        self._slots[position] = self._start_worker()
        self._restarts += 1

    def _count_startup_death(self, slot: _Slot) -> None:
        self._startup_failures += 1
        if self._startup_failures >= _MAX_STARTUP_FAILURES:
            raise RuntimeError(
                f"grading workers died while starting {self._startup_failures} times in a row "
                f"(last exit code {slot.process.poll()})"
            )

    def _mark_ready(self, slot: _Slot, message: tuple) -> None:
        if message[0] == "error":
            raise RuntimeError(f"a grading worker failed to start:\n{message[1]}")
        slot.ready = True
        self._startup_failures = 0

    def wait_ready(self) -> None:
        """Blocks until every worker has started (imported math-verify).

        Grading does not need this (items go to workers as they become ready); it lets a caller
        pay the start-up before a timed section.

        Raises:
          RuntimeError: when a worker fails to start or takes over `startup_timeout_s`.
        """
        if not self._finalizer.alive:
            raise RuntimeError("the grader is closed")
        for position in range(len(self._slots)):
            while not self._slots[position].ready:
                slot = self._slots[position]
                remaining_s = slot.started_at + self._startup_timeout_s - time.monotonic()
                if remaining_s <= 0 or not slot.connection.poll(remaining_s):
                    raise RuntimeError(
                        f"a grading worker did not start within {self._startup_timeout_s} s"
                    )
                try:
                    message = slot.connection.recv()
                except (EOFError, OSError):
                    self._count_startup_death(slot)
                    self._replace(position)
                    continue
                self._mark_ready(slot, message)

    @property
    def pids(self) -> list[int]:
        """The current worker processes' ids (they change when workers are replaced)."""
        return [slot.process.pid for slot in self._slots]

    @property
    def stats(self) -> GraderStats:
        """Counts of graded items by outcome and of worker restarts, over the grader's life."""
        counts = self._counts
        return GraderStats(
            items=sum(counts.values()),
            correct=counts[_verify.CORRECT],
            wrong=counts[_verify.WRONG],
            no_answer=counts[_verify.NO_ANSWER],
            timeouts=counts[TIMEOUT],
            crashes=counts[CRASH],
            restarts=self._restarts,
        )

    def close(self) -> None:
        """Stops the workers; the grader cannot grade afterwards. Safe to call twice."""
        self._finalizer()

    def __enter__(self) -> MathGrader:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    # ---- grading -------------------------------------------------------------------------------

    def grade(
        self, completions: Iterable[str], golds: Iterable[str], *, progress: bool | None = None
    ) -> list[float]:
        """Scores each completion against its gold answer: 1.0 if correct, else 0.0.

        Args:
          completions: model responses (any iterable; pulled lazily).
          golds: gold final answers, one per completion.
          progress: show a tqdm progress bar; None uses the grader's default.

        Returns:
          One score per pair, in input order. Timeouts and crashes score 0.0 (see `stats`).
        """
        return [grade.score for grade in self.grade_items(completions, golds, progress=progress)]

    def grade_items(
        self, completions: Iterable[str], golds: Iterable[str], *, progress: bool | None = None
    ) -> list[Grade]:
        """Like `grade`, with each item's status.

        Args:
          completions: model responses (any iterable; pulled lazily).
          golds: gold final answers, one per completion.
          progress: show a tqdm progress bar; None uses the grader's default.

        Returns:
          One `Grade(score, status)` per pair, in input order.

        Raises:
          ValueError: when the two inputs differ in length.
          RuntimeError: when the grader is closed or a worker cannot start.
        """
        if not self._finalizer.alive:
            raise RuntimeError("the grader is closed")
        if hasattr(completions, "__len__") and hasattr(golds, "__len__"):
            if len(completions) != len(golds):
                raise ValueError(
                    f"completions and golds must have the same length, got {len(completions)} "
                    f"and {len(golds)}"
                )
        total = len(completions) if hasattr(completions, "__len__") else None
        show = self.progress if progress is None else progress
        with tqdm(total=total, disable=not show, desc="grading", unit="item") as bar:
            try:
                return self._run(zip(completions, golds, strict=True), bar)
            except BaseException:
                # Interrupted mid-batch (Ctrl-C, unequal lengths, a failed start): workers still
                # holding this call's items would answer the next call, so replace them.
                for position, slot in enumerate(self._slots):
                    if slot.queued:
                        self._replace(position)
                raise

    def _run(self, pairs, bar) -> list[Grade]:
        results: dict[int, Grade] = {}
        payloads: dict[int, tuple[str, str]] = {}  # items sent and not yet graded
        retry: collections.deque = collections.deque()  # items to send again, oldest first
        next_index = 0
        exhausted = False

        def finish(index: int, status: str) -> None:
            results[index] = Grade(1.0 if status == _verify.CORRECT else 0.0, status)
            payloads.pop(index, None)
            self._counts[status] += 1
            bar.update(1)

        def lose_worker(position: int, status: str) -> None:
            """Scores the worker's current item as `status`, re-queues the rest, replaces it."""
            queued = self._slots[position].queued
            if queued:
                finish(queued.popleft(), status)
                retry.extendleft(reversed(queued))
            self._replace(position)

        for position, slot in enumerate(self._slots):
            if slot.process.poll() is not None:
                self._replace(position)

        while True:
            # Hand out items one at a time to the least loaded ready worker, up to max_in_flight.
            while retry or not exhausted:
                open_slots = [
                    (len(slot.queued), position)
                    for position, slot in enumerate(self._slots)
                    if slot.ready and len(slot.queued) < self.max_in_flight
                ]
                if not open_slots:
                    break
                position = min(open_slots)[1]
                slot = self._slots[position]
                if retry:
                    index = retry.popleft()
                else:
                    try:
                        completion, gold = next(pairs)
                    except StopIteration:
                        exhausted = True
                        break
                    index, next_index = next_index, next_index + 1
                    payloads[index] = (completion, gold)
                try:
                    slot.connection.send((index, *payloads[index]))
                except OSError:  # the worker died; this item never reached it
                    retry.appendleft(index)
                    lose_worker(position, CRASH)
                    continue
                if not slot.queued:
                    slot.head_since = time.monotonic()
                slot.queued.append(index)
            if exhausted and not retry and not any(slot.queued for slot in self._slots):
                break

            # Wait for a message or the nearest deadline.
            now = time.monotonic()
            deadlines = [
                slot.head_since + self._hard_timeout_s
                if slot.ready
                else slot.started_at + self._startup_timeout_s
                for slot in self._slots
                if slot.queued or not slot.ready
            ]
            wait_s = max(0.0, min(deadlines) - now) if deadlines else None
            by_connection = {slot.connection: position for position, slot in enumerate(self._slots)}
            for connection in wait(list(by_connection), wait_s):
                position = by_connection[connection]
                slot = self._slots[position]
                try:
                    message = connection.recv()
                except (EOFError, OSError):
                    if not slot.ready:
                        self._count_startup_death(slot)
                    lose_worker(position, CRASH)
                    continue
                if message[0] in ("ready", "error"):
                    self._mark_ready(slot, message)
                else:
                    index, status = message
                    slot.queued.popleft()
                    finish(index, status)
                    slot.head_since = time.monotonic()

            # Enforce deadlines.
            now = time.monotonic()
            for position, slot in enumerate(self._slots):
                if not slot.ready and now > slot.started_at + self._startup_timeout_s:
                    raise RuntimeError(
                        f"a grading worker did not start within {self._startup_timeout_s} s"
                    )
                if slot.ready and slot.queued and now > slot.head_since + self._hard_timeout_s:
                    lose_worker(position, TIMEOUT)
        return [results[index] for index in range(next_index)]
