"""The simulator fitted to a real run: warm-start skill logits from per-level pass@1, a learning
rate from GRPO's movement, and the methods' predicted gains over GRPO.

The learner's expected pass@1 on level `l` is `E_c[prod_{j<l} sigmoid(theta_j + c)]` over the
per-prompt offset `c ~ N(0, offset_std^2)` (`_learner.py`). `fit_skill_logits` inverts that one
level at a time: level `l`'s pass@1 fixes `theta_{l-1}` given the skills before it, since the
expectation grows monotonically in it. Observed pass rates need not fall with the level (a sample
of 32 problems per level is noisy), and the learner's cannot rise, so they are first made
non-increasing by pooling adjacent violators (isotonic regression).
"""

from collections.abc import Callable, Mapping, Sequence

import numpy as np

from gdro_jax.sim._simulate import SimOutput

# Skill logits are searched in this range: sigmoid(-20) ~ 2e-9 and sigmoid(12) ~ 1 - 6e-6.
_LOGIT_RANGE = (-20.0, 12.0)
_QUADRATURE_NODES = 48


def _offset_nodes(offset_std: float) -> tuple[np.ndarray, np.ndarray]:
    """Gauss-Hermite nodes and weights for an expectation over c ~ N(0, offset_std^2)."""
    nodes, weights = np.polynomial.hermite.hermgauss(_QUADRATURE_NODES)
    return np.sqrt(2.0) * offset_std * nodes, weights / np.sqrt(np.pi)


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 0.5 * (1.0 + np.tanh(0.5 * x))


def expected_pass_at_1(theta_L: Sequence[float], offset_std: float) -> np.ndarray:
    """float64[L] the learner's expected pass@1 per level over the prompt offsets.

    Args:
      theta_L: float[L] skill logits.
      offset_std: the per-prompt offset's standard deviation (>= 0).
    """
    theta_L = np.asarray(theta_L, np.float64)
    c, w = _offset_nodes(offset_std)
    chain_CL = np.cumprod(_sigmoid(theta_L[None, :] + c[:, None]), axis=1)
    return w @ chain_CL


def non_increasing(values: Sequence[float]) -> np.ndarray:
    """The closest non-increasing sequence in least squares (pool adjacent violators)."""
    blocks: list[list[float]] = []  # [sum, count] per block
    for value in np.asarray(values, np.float64):
        blocks.append([float(value), 1.0])
        while len(blocks) > 1 and blocks[-2][0] / blocks[-2][1] < blocks[-1][0] / blocks[-1][1]:
            total, count = blocks.pop()
            blocks[-1][0] += total
            blocks[-1][1] += count
    return np.concatenate([np.full(int(n), s / n) for s, n in blocks])


def fit_skill_logits(
    pass1_L: Sequence[float], offset_std: float, *, floor: float = 1e-4
) -> np.ndarray:
    """Skill logits whose expected pass@1 per level equals `pass1_L` (made non-increasing).

    Args:
      pass1_L: float[L] observed pass@1 of levels 1..L, each in [0, 1].
      offset_std: the simulator's per-prompt offset standard deviation (>= 0).
      floor: targets are clipped to at least this (a level never solved in a sample is not
        unsolvable; the logit of an exact zero would be minus infinity).

    Returns:
      float64[L] logits `theta`; a level whose target equals the level before it gets the top
      of the search range (its extra step always succeeds).
    """
    pass1_L = np.asarray(pass1_L, np.float64)
    if pass1_L.ndim != 1 or not len(pass1_L) or not np.all((pass1_L >= 0) & (pass1_L <= 1)):
        raise ValueError(f"pass1_L must be a non-empty list of rates in [0, 1], got {pass1_L!r}")
    if not (np.isfinite(offset_std) and offset_std >= 0.0):
        raise ValueError(f"offset_std must be >= 0, got offset_std={offset_std!r}")
    target_L = np.maximum(non_increasing(pass1_L), floor)
    c, w = _offset_nodes(offset_std)
    chain_C = np.ones_like(c)  # prod_{j<l-1} sigmoid(theta_j + c) at each node
    theta = []
    for target in target_L:
        low, high = _LOGIT_RANGE
        for _ in range(80):  # bisection: the expectation is increasing in the new logit
            middle = 0.5 * (low + high)
            if w @ (chain_C * _sigmoid(middle + c)) < target:
                low = middle
            else:
                high = middle
        theta.append(0.5 * (low + high))
        chain_C = chain_C * _sigmoid(theta[-1] + c)
    return np.asarray(theta)


def pass1_gain(output: SimOutput) -> float:
    """The mean over seeds of the rise of pass@1 averaged over levels (equal problems per level,
    as the real held-out splits), from the first step's evaluation to the final one."""
    initial = np.asarray(output.trace.pass1)[:, 0].mean(axis=-1)
    final = np.asarray(output.final_pass1).mean(axis=-1)
    return float((final - initial).mean())


def calibrate_learning_rate(
    run_grpo: Callable[[float], SimOutput], target: float, candidates: Sequence[float]
) -> tuple[float, list[tuple[float, float]]]:
    """The learning rate at which GRPO's simulated pass@1 gain (`pass1_gain`) equals `target`.

    Runs `run_grpo(lr)` at each candidate (ascending) and interpolates the gain linearly in
    log(lr) between the two candidates that bracket the target.

    Returns:
      `(lr, [(candidate, gain), ...])`.

    Raises:
      ValueError: the candidates' gains do not bracket the target (the table says which way).
    """
    candidates = sorted(float(lr) for lr in candidates)
    table = [(lr, pass1_gain(run_grpo(lr))) for lr in candidates]
    for (lr0, g0), (lr1, g1) in zip(table, table[1:], strict=False):
        if min(g0, g1) <= target <= max(g0, g1) and g0 != g1:
            fraction = (target - g0) / (g1 - g0)
            return float(np.exp(np.log(lr0) + fraction * (np.log(lr1) - np.log(lr0)))), table
    raise ValueError(
        f"no learning rate among {candidates} brackets the target pass@1 gain {target:.4f}; "
        f"gains: {', '.join(f'{lr:g}: {g:.4f}' for lr, g in table)}"
    )


def predicted_gains(
    outputs: Mapping[str, SimOutput],
    baseline: str,
    frontier_levels: Sequence[int],
    eval_k: int,
    frontier_problems: Sequence[int] | None = None,
) -> dict[str, dict[str, float]]:
    """Each method's relative gain over `baseline` as the study reports it (ratio of means over
    seeds minus one): frontier pass@k, pooled pass@1 (levels weighted equally) and frontier
    pass@1. Seeds share pools and held-out sets across methods, as the study's pairing does.

    Args:
      outputs: `{method: SimOutput}` with a leading seed axis.
      baseline: the method the gains are relative to.
      frontier_levels: the frontier's levels (1..L).
      eval_k: the k of `final_pass_k`.
      frontier_problems: the real test split's problems on each frontier level: a frontier
        figure there is a mean over problems, so each level's simulated mean is weighted by
        them (default: equal weights).
    """
    index = np.asarray(frontier_levels, np.int64) - 1
    weights = np.ones(len(index)) if frontier_problems is None else np.asarray(frontier_problems)
    if weights.shape != index.shape:
        raise ValueError(
            f"frontier_problems must give one count per frontier level {list(frontier_levels)}, "
            f"got {frontier_problems!r}"
        )
    weights = weights / weights.sum()

    def figures(output: SimOutput) -> dict[str, float]:
        pass1_SL, pass_k_SL = np.asarray(output.final_pass1), np.asarray(output.final_pass_k)
        return {
            f"frontier pass@{eval_k}": float(pass_k_SL[:, index].mean(axis=0) @ weights),
            "pooled pass@1": float(pass1_SL.mean()),
            "frontier pass@1": float(pass1_SL[:, index].mean(axis=0) @ weights),
        }

    base = figures(outputs[baseline])
    return {
        method: {name: value / base[name] - 1.0 for name, value in figures(output).items()}
        for method, output in outputs.items()
        if method != baseline
    }
