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
    num_seeds, num_problems = base_SP.shape
    rng = np.random.default_rng(seed)
    seed_draws = rng.integers(0, num_seeds, size=(num_resamples, num_seeds))
    problem_draws = rng.integers(0, num_problems, size=(num_resamples, num_problems))
    gains = bootstrap_gains(method_SP, base_SP, seed_draws, problem_draws)
    gains = gains[np.isfinite(gains)]
    tail = (1 - confidence) / 2 * 100
    low, high = np.percentile(gains, [tail, 100 - tail])
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
