"""The evaluation's collectives when several processes run it (`jax.distributed` initialised).

Every process holds the policy on its own devices and samples and grades its own share of the
batches; process 0 gets every process's results and alone reads and writes the output folder.
With one process both functions return their input as it is.
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np
from jax.experimental import multihost_utils


def is_primary() -> bool:
    """True in process 0, the one that reads and writes the output folder."""
    return jax.process_index() == 0


def from_primary(tree: Any) -> Any:
    """Process 0's numpy `tree` in every process (each passes a tree of the same shapes)."""
    if jax.process_count() == 1:
        return tree
    return jax.tree.map(np.asarray, multihost_utils.broadcast_one_to_all(tree))


def gather(tree: Any) -> list[Any]:
    """Every process's numpy `tree` (same shapes in all), in process order."""
    if jax.process_count() == 1:
        return [tree]
    stacked = jax.tree.map(np.asarray, multihost_utils.process_allgather(tree))
    return [jax.tree.map(lambda leaf, p=p: leaf[p], stacked) for p in range(jax.process_count())]
