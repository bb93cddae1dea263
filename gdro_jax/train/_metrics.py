"""Per-step metrics to disk: one JSON object per line in `metrics.jsonl`, and TensorBoard events.

Scalars are written as numbers; per-bin arrays (names starting `bin/`) as lists in JSON and as one
TensorBoard scalar per bin (`bin/q/3`). Every line carries `step`.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from typing import Any

import numpy as np


def to_host(metrics: Mapping[str, Any]) -> dict[str, Any]:
    """Device scalars and arrays to Python floats and lists (NaN and inf kept as strings)."""

    def convert(value):
        array = np.asarray(value)
        if array.ndim == 0:
            number = array.item()
            if isinstance(number, float) and not math.isfinite(number):
                return str(number)
            return number
        return [convert(v) for v in array]

    return {name: convert(value) for name, value in metrics.items()}


class MetricsWriter:
    """Writes step metrics to `workdir/metrics.jsonl` and TensorBoard event files in `workdir/tb`.

    Args:
      workdir: the run's folder (created if missing).
      tensorboard: also write TensorBoard event files.
      append: keep the rows already in `metrics.jsonl` (a resumed run); False starts the file
        afresh (a new run in the same folder).
      purge_step: for a resumed run, the first step to be redone: TensorBoard hides events of
        this step and later that an earlier process wrote, so redone steps are not drawn twice.
    """

    def __init__(
        self,
        workdir: str | os.PathLike,
        *,
        tensorboard: bool = True,
        append: bool = True,
        purge_step: int | None = None,
    ):
        os.makedirs(workdir, exist_ok=True)
        self.path = os.path.join(workdir, "metrics.jsonl")
        mode = "a" if append else "w"
        self._file = open(self.path, mode, encoding="utf-8")  # noqa: SIM115 (closed in close())
        self._tb = None
        if tensorboard:
            from tensorboardX import SummaryWriter

            self._tb = SummaryWriter(os.path.join(workdir, "tb"), purge_step=purge_step)

    def write(self, step: int, metrics: Mapping[str, Any]) -> dict[str, Any]:
        """Writes one step's metrics; returns them as host values."""
        row = {"step": int(step), **to_host(metrics)}
        self._file.write(json.dumps(row) + "\n")
        self._file.flush()
        if self._tb is not None:
            for name, value in row.items():
                if name == "step":
                    continue
                if isinstance(value, list):
                    for index, item in enumerate(value):
                        if isinstance(item, int | float):
                            self._tb.add_scalar(f"{name}/{index}", item, step)
                elif isinstance(value, int | float):
                    self._tb.add_scalar(name, value, step)
        return row

    def close(self) -> None:
        self._file.close()
        if self._tb is not None:
            self._tb.close()

    def __enter__(self) -> MetricsWriter:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def read_metrics(path: str | os.PathLike) -> list[dict[str, Any]]:
    """Reads a `metrics.jsonl` file back into a list of dicts (one per step)."""
    with open(path, encoding="utf-8") as file:
        return [json.loads(line) for line in file if line.strip()]
