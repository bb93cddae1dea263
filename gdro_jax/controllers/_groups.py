"""What the group filters share: the check that every leaf of a round's groups has N rows."""

from __future__ import annotations

from typing import Any

import jax


def check_groups(groups: Any, num_groups: int) -> None:
    """Raises a ValueError unless every leaf of `groups` has a leading axis of `num_groups`."""
    for leaf in jax.tree.leaves(groups):
        if leaf.shape[:1] != (num_groups,):
            raise ValueError(
                f"every leaf of the groups must have a leading axis of num_groups="
                f"{num_groups}, got a leaf of shape {tuple(leaf.shape)}"
            )
