"""The grain input pipeline over dataset rows: index, shuffle by seed, repeat, batch, resume.

`make_pipeline(rows, seed=...)` is a `grain.MapDataset`; `iter(...)` on it gives an iterator
whose `get_state()` / `set_state(state)` checkpoint and resume the position exactly (the state is
a small dict that can be saved next to the train state). Each element is a row with its prompt
index added under `"index"` (its position in `rows`, SPEC 9), which is what the classifier and
Prompt-GDRO key their per-prompt state on. With `shuffle=True` every epoch has its own order,
derived from `seed`, so two pipelines with the same rows and seed yield the same stream.
"""

from __future__ import annotations

from collections.abc import Sequence

import grain


def make_pipeline(
    rows: Sequence[dict],
    *,
    seed: int | None = 0,
    shuffle: bool = True,
    num_epochs: int | None = None,
    batch_size: int | None = None,
    drop_remainder: bool = False,
) -> grain.MapDataset:
    """A grain dataset over `rows` (with `"index"` added), shuffled, repeated and batched.

    Args:
      rows: dataset rows, e.g. from `load_preset`.
      seed: the shuffle seed (required when `shuffle`).
      shuffle: shuffle the rows, with a fresh order each epoch.
      num_epochs: passes over the data; None repeats forever.
      batch_size: when given, elements are lists of `batch_size` rows (batches may span an epoch
        boundary when repeating); None yields single rows.
      drop_remainder: drop a last short batch (finite `num_epochs` only).

    Returns:
      A `grain.MapDataset`; iterate with `iter(dataset)` and checkpoint the iterator with
      `get_state()` / `set_state()`.

    Raises:
      ValueError: for empty `rows`, `num_epochs < 1`, `batch_size < 1`, or `shuffle` without a
        seed.
    """
    if len(rows) == 0:
        raise ValueError("rows must not be empty")
    if num_epochs is not None and num_epochs < 1:
        raise ValueError(f"num_epochs must be >= 1 or None, got num_epochs={num_epochs}")
    if batch_size is not None and batch_size < 1:
        raise ValueError(f"batch_size must be >= 1 or None, got batch_size={batch_size}")
    if shuffle and seed is None:
        raise ValueError("shuffle=True needs an integer seed, got seed=None")
    # The index is attached up front: `map_with_index` downstream of `repeat` sees the position
    # in the repeated stream, not in `rows`.
    indexed = [{**row, "index": index} for index, row in enumerate(rows)]
    dataset = grain.MapDataset.source(indexed)
    if shuffle:
        dataset = dataset.shuffle(seed=seed)
    if num_epochs != 1:
        dataset = dataset.repeat(num_epochs)
    if batch_size is not None:
        dataset = dataset.batch(batch_size, drop_remainder=drop_remainder, batch_fn=list)
    return dataset
