"""The study's primary statistic: a method's relative gain over GRPO, paired by seed and problem.

Every method runs with the same seeds and is evaluated on the same held-out problems, so a
method's and GRPO's figures form pairs: `method_SP[s, p]` and `base_SP[s, p]` are the metric of
problem p (e.g. its unbiased pass@8) after the run of seed s. The gain is a ratio of means,

    G = mean_sp(method) / mean_sp(base) - 1,

and its interval a paired bootstrap: seeds and problems are each resampled with replacement, the
same draws for both methods (the pairs stay pairs), and the interval is the percentile interval
of the resampled gains. The seed resampling carries the run-to-run variation of RL, the problem
resampling the finite test set.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from numpy.typing import ArrayLike


class PairedGain(NamedTuple):
    """A relative gain with its paired bootstrap interval (see the module docstring)."""

    gain: float  # mean(method) / mean(base) - 1
    low: float  # the interval's lower end
    high: float  # its upper end
    per_seed: tuple[float, ...]  # mean_p(method[s]) / mean_p(base[s]) - 1 for each seed
    standard_error: float  # the bootstrap gains' standard deviation


def _pairs(method_SP: ArrayLike, base_SP: ArrayLike) -> tuple[np.ndarray, np.ndarray]:
    method_SP = np.asarray(method_SP, np.float64)
    base_SP = np.asarray(base_SP, np.float64)
    if method_SP.ndim != 2 or method_SP.shape != base_SP.shape or 0 in method_SP.shape:
        raise ValueError(
            "method_SP and base_SP must be [seeds, problems] arrays of one non-empty shape, got "
            f"{method_SP.shape} and {base_SP.shape}"
        )
    if not (np.isfinite(method_SP).all() and np.isfinite(base_SP).all()):
        raise ValueError("method_SP and base_SP must be finite")
    return method_SP, base_SP


def bootstrap_gains(
    method_SP: ArrayLike, base_SP: ArrayLike, seed_draws_KS: ArrayLike, problem_draws_KP: ArrayLike
) -> np.ndarray:
    """The relative gain on each of K resamples, given the drawn seed and problem indices.

    Args:
      method_SP, base_SP: the paired per-problem figures, [seeds, problems].
      seed_draws_KS: int [K, S], the seeds of each resample (indices into S).
      problem_draws_KP: int [K, P], the problems of each resample (indices into P).

    Returns:
      float [K]: `mean(method[draws]) / mean(base[draws]) - 1` per resample (NaN where the
      resampled base mean is 0).
    """
    method_SP, base_SP = _pairs(method_SP, base_SP)
    seeds_KS = np.asarray(seed_draws_KS, np.int64)
    problems_KP = np.asarray(problem_draws_KP, np.int64)
    # mean over the resampled seed x problem grid = (1/SP) sum_s sum_p x[seed_ks, problem_kp].
    picked_m = method_SP[seeds_KS[:, :, None], problems_KP[:, None, :]].mean(axis=(1, 2))
    picked_b = base_SP[seeds_KS[:, :, None], problems_KP[:, None, :]].mean(axis=(1, 2))
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(picked_b > 0, picked_m / picked_b - 1.0, np.nan)


def _draws(shape: tuple[int, int], num_resamples: int, seed: int):
    """The bootstrap's draws: int [K, S] seed indices and int [K, P] problem indices."""
    num_seeds, num_problems = shape
    rng = np.random.default_rng(seed)
    seed_draws = rng.integers(0, num_seeds, size=(num_resamples, num_seeds))
    return seed_draws, rng.integers(0, num_problems, size=(num_resamples, num_problems))


def _percentiles(values: np.ndarray, confidence: float) -> tuple[float, float]:
    tail = (1 - confidence) / 2 * 100
    low, high = np.percentile(values, [tail, 100 - tail])
    return float(low), float(high)


def paired_relative_gain(
    method_SP: ArrayLike,
    base_SP: ArrayLike,
    *,
    num_resamples: int = 10_000,
    confidence: float = 0.95,
    seed: int = 0,
) -> PairedGain:
    """A method's relative gain over the base with a paired bootstrap interval (module docstring).

    Args:
      method_SP, base_SP: [seeds, problems] per-problem figures; row s of both comes from seed s,
        column p from problem p.
      num_resamples: bootstrap resamples.
      confidence: the interval's coverage.
      seed: the bootstrap's random seed.

    Returns:
      `PairedGain`. Resamples whose base mean is 0 are dropped from the interval.

    Raises:
      ValueError: shapes that differ, non-finite values, or a base whose mean is 0.
    """
    method_SP, base_SP = _pairs(method_SP, base_SP)
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be in (0, 1), got confidence={confidence!r}")
    if base_SP.mean() <= 0:
        raise ValueError("the base's mean is 0: a relative gain is undefined")
    seed_draws, problem_draws = _draws(base_SP.shape, num_resamples, seed)
    gains = bootstrap_gains(method_SP, base_SP, seed_draws, problem_draws)
    gains = gains[np.isfinite(gains)]
    low, high = _percentiles(gains, confidence)
    with np.errstate(divide="ignore", invalid="ignore"):
        per_seed = method_SP.mean(axis=1) / base_SP.mean(axis=1) - 1.0
    return PairedGain(
        gain=float(method_SP.mean() / base_SP.mean() - 1.0),
        low=float(low),
        high=float(high),
        per_seed=tuple(float(g) for g in per_seed),
        standard_error=float(gains.std(ddof=1)),
    )


def detectable_gain(standard_error: float, *, z_alpha: float = 1.96, z_power: float = 0.8416):
    """The smallest true gain a two-sided test at 5 % finds with 80 % power, given the gain's
    standard error: `(z_{1-alpha/2} + z_{power}) * SE` (2.8 SE)."""
    return (z_alpha + z_power) * standard_error


def paired_gain_change(
    method_a_SP: ArrayLike,
    base_a_SP: ArrayLike,
    method_b_SP: ArrayLike,
    base_b_SP: ArrayLike,
    *,
    num_resamples: int = 10_000,
    confidence: float = 0.95,
    seed: int = 0,
) -> PairedGain:
    """How a method's relative gain over the base changes between two evaluations of the same
    runs on the same problems (e.g. after 150 and after 600 steps): `G_b - G_a`, with a paired
    bootstrap interval whose every resample draws the same seeds and problems for all four
    arrays (the runs and the problems stay paired across the two points).

    Args:
      method_a_SP, base_a_SP: [seeds, problems] figures at the first point.
      method_b_SP, base_b_SP: the same seeds and problems at the second.
      num_resamples, confidence, seed: as `paired_relative_gain`.

    Returns:
      `PairedGain` of the difference (`per_seed`: each seed's difference of its gains).

    Raises:
      ValueError: the four shapes differ, non-finite values, or a base whose mean is 0.
    """
    method_a_SP, base_a_SP = _pairs(method_a_SP, base_a_SP)
    method_b_SP, base_b_SP = _pairs(method_b_SP, base_b_SP)
    if method_a_SP.shape != method_b_SP.shape:
        raise ValueError(
            "the two points must hold the same seeds and problems, got shapes "
            f"{method_a_SP.shape} and {method_b_SP.shape}"
        )
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be in (0, 1), got confidence={confidence!r}")
    if base_a_SP.mean() <= 0 or base_b_SP.mean() <= 0:
        raise ValueError("a base's mean is 0: a relative gain is undefined")
    seed_draws, problem_draws = _draws(base_a_SP.shape, num_resamples, seed)
    changes = bootstrap_gains(method_b_SP, base_b_SP, seed_draws, problem_draws)
    changes = changes - bootstrap_gains(method_a_SP, base_a_SP, seed_draws, problem_draws)
    changes = changes[np.isfinite(changes)]
    low, high = _percentiles(changes, confidence)
    with np.errstate(divide="ignore", invalid="ignore"):
        per_seed = (method_b_SP.mean(axis=1) / base_b_SP.mean(axis=1)) - (
            method_a_SP.mean(axis=1) / base_a_SP.mean(axis=1)
        )
    gain_a = method_a_SP.mean() / base_a_SP.mean() - 1.0
    gain_b = method_b_SP.mean() / base_b_SP.mean() - 1.0
    return PairedGain(
        gain=float(gain_b - gain_a),
        low=float(low),
        high=float(high),
        per_seed=tuple(float(g) for g in per_seed),
        standard_error=float(changes.std(ddof=1)),
    )
