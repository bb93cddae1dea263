"""Validation of static hyperparameters and of array shapes shared by the loss functions.

Hyperparameters (clip ranges, epsilons, coefficients, modes) are static Python values: they are
checked once at trace time and raise `ValueError` naming the parameter and its value.
"""

from __future__ import annotations

from collections.abc import Sequence

import chex
import jax


def check_at_least(name: str, value: float, bound: float) -> float:
    """Returns `float(value)`; raises ValueError unless `value >= bound` (NaN fails)."""
    number = float(value)
    if not number >= bound:
        raise ValueError(f"{name} must be >= {bound}, got {name}={value!r}")
    return number


def check_positive(name: str, value: float) -> float:
    """Returns `float(value)`; raises ValueError unless `value > 0` (NaN fails)."""
    number = float(value)
    if not number > 0:
        raise ValueError(f"{name} must be > 0, got {name}={value!r}")
    return number


def check_choice(name: str, value: str, choices: Sequence[str]) -> str:
    """Returns `value`; raises ValueError unless it is one of `choices`."""
    if value not in choices:
        raise ValueError(f"{name} must be one of {tuple(choices)}, got {name}={value!r}")
    return value


def check_token_arrays(mask_RT: jax.Array, **arrays_RT: jax.Array) -> None:
    """Checks that `mask_RT` is rank 2 and every named array has its shape."""
    chex.assert_rank(mask_RT, 2)
    for name, array in arrays_RT.items():
        if array.shape != mask_RT.shape:
            raise ValueError(
                f"{name} must have the shape of mask_RT {mask_RT.shape}, got {array.shape}"
            )
