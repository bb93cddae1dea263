"""Online difficulty classifier: each prompt's pass@k bin from its own recent rollouts.

State is keyed by the prompt's stable dataset index `0..D-1`: per prompt a ring buffer of the last
`H` per-visit statistics (`H = 0`: a running sum), a visit count and the last assigned bin. The
estimate `p_hat` is the mean of the stored statistics and the bin is the position of `p_hat` among
ascending edges (bin 0 is the hardest, bin `B - 1` the easiest), with optional hysteresis.

Timing: `bins(state, ids)` only reads the state, so the bins used at step `t` come from the
visits up to step `t - 1`; `update` records step `t`'s rollouts and stores each updated prompt's
new bin. Both gather and scatter at the batch's indices only, so a step costs O(batch), never
O(dataset).

References:
  Panaganti et al., "Multi-Adversary Group DRO for RL post-training of LLM reasoning", 2026
  (arXiv 2601.19280), online pass@k difficulty bins. Chen et al., "Evaluating Large Language
  Models Trained on Code", 2021 (arXiv 2107.03374), eq. 1: the unbiased pass@k estimator.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import NamedTuple, Protocol

import chex
import jax
import jax.numpy as jnp
import numpy as np
from jax.typing import ArrayLike

DEFAULT_EDGES: tuple[float, ...] = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)
STATISTICS: tuple[str, ...] = ("pass_at_k", "any_correct", "mean_accuracy")
# Comparisons with an edge count values within this distance of it as on the edge, so that a
# p_hat lying exactly on an edge in exact arithmetic (3 of 10 correct against the edge 0.3, or the
# mean of 0.1 and 0.2 against 0.15) lands in the upper bin whatever float32 rounding does.
TIE_TOLERANCE = 1e-6


class PassKState(NamedTuple):
    """State of the online difficulty classifier over `D` prompts."""

    history: jax.Array  # [D, max(H, 1)] float32 ring buffer of per-visit statistics (H=0: sum)
    visits: jax.Array  # [D] int32 number of visits recorded so far
    last_bin: jax.Array  # [D] int32 bin assigned at the last visit, -1 for never seen


class ClassifierUpdate(Protocol):
    """`update(state, prompt_ids, *, num_correct, num_rollouts, valid=None) -> PassKState`.

    Observations are keyword-only, so a missing or misplaced signal fails loudly.
    """

    def __call__(
        self,
        state: PassKState,
        prompt_ids: ArrayLike,
        *,
        num_correct: ArrayLike,
        num_rollouts: ArrayLike,
        valid: ArrayLike | None = None,
    ) -> PassKState: ...


class PassKClassifier(NamedTuple):
    """Pure functions of the online difficulty classifier (see `passk_classifier`)."""

    init: Callable[[], PassKState]
    bins: Callable[[PassKState, ArrayLike], jax.Array]  # (state, prompt_ids) -> [N] int32
    p_hat: Callable[[PassKState, ArrayLike], jax.Array]  # (state, prompt_ids) -> [N] float32
    update: ClassifierUpdate
    num_bins: int
    edges: tuple[float, ...]
    num_prompts: int  # D, the prompts it tracks (ids 0..D-1)


def _check_statistic(statistic: str, k: int) -> None:
    if statistic not in STATISTICS:
        raise ValueError(f"statistic must be one of {STATISTICS}, got statistic={statistic!r}")
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
        raise ValueError(f"k must be an integer >= 1, got k={k!r}")


def per_visit_statistic(
    num_correct: ArrayLike,
    num_rollouts: ArrayLike,
    *,
    statistic: str = "pass_at_k",
    k: int = 8,
) -> jax.Array:
    """Per-visit difficulty statistic from `c` correct out of `n` rollouts, elementwise.

    `pass_at_k` is the unbiased estimator `1 - C(n - c, k') / C(n, k')` with `k' = min(k, n)`,
    computed as `1 - prod_{i < k'} (n - c - i) / (n - i)`: every factor lies in [0, 1], so the
    product neither overflows nor cancels, and it stays comparable across prompts given different
    `n` (as Rollout-GDRO does). `any_correct` is `1[c > 0]` (the authors' released code) and
    `mean_accuracy` is `c / n`. `c` is clipped into `[0, n]`; `n <= 0` means no observation and
    gives 0.

    Args:
      num_correct: int array `c`, correct rollouts, broadcastable against `num_rollouts`.
      num_rollouts: int array `n`, rollouts drawn.
      statistic: `"pass_at_k"`, `"any_correct"` or `"mean_accuracy"`.
      k: the `k` of pass@k (static, >= 1); unused by the other statistics.

    Returns:
      float32 array of the broadcast shape, values in [0, 1].

    Raises:
      ValueError: for an unknown `statistic` or `k < 1`.

    References:
      Chen et al., 2021 (arXiv 2107.03374), eq. 1.
    """
    _check_statistic(statistic, k)
    n = jnp.maximum(jnp.asarray(num_rollouts, jnp.int32), 0)
    c = jnp.clip(jnp.asarray(num_correct, jnp.int32), 0, n)
    c, n = jnp.broadcast_arrays(c, n)
    if statistic == "any_correct":
        value = (c > 0).astype(jnp.float32)
    elif statistic == "mean_accuracy":
        value = c.astype(jnp.float32) / jnp.maximum(n, 1).astype(jnp.float32)
    else:
        i = jnp.arange(k, dtype=jnp.int32)
        active = i < jnp.minimum(n, k)[..., None]
        numerator = jnp.maximum(n - c, 0)[..., None] - i
        # Factors past k' are masked to 1 with a safe denominator, so no 0/0 is ever formed.
        denominator = jnp.where(active, n[..., None] - i, 1)
        ratio = jnp.maximum(numerator, 0).astype(jnp.float32) / denominator.astype(jnp.float32)
        value = 1.0 - jnp.prod(jnp.where(active, ratio, 1.0), axis=-1)
    return jnp.where(n > 0, value, 0.0).astype(jnp.float32)


def _check_int(name: str, value: int, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {name}={value!r}")
    return int(value)


def _check_edges(edges: Sequence[float]) -> tuple[float, ...]:
    try:
        values = tuple(float(e) for e in edges)
    except (TypeError, ValueError) as error:
        raise ValueError(f"edges must be a sequence of floats, got edges={edges!r}") from error
    if not all(0.0 < e < 1.0 for e in values):  # also rejects NaN
        raise ValueError(f"edges must be bin edges strictly inside (0, 1), got edges={values!r}")
    if any(b <= a for a, b in zip(values, values[1:], strict=False)):
        raise ValueError(f"edges must be strictly ascending, got edges={values!r}")
    return values


def _check_unseen(unseen: str | float) -> float:
    if isinstance(unseen, str):
        if unseen != "hardest":
            raise ValueError(f"unseen must be 'hardest' or a float in [0, 1], got {unseen=!r}")
        return 0.0
    if isinstance(unseen, bool) or not isinstance(unseen, (int, float, np.integer, np.floating)):
        raise ValueError(f"unseen must be 'hardest' or a float in [0, 1], got {unseen=!r}")
    if not 0.0 <= float(unseen) <= 1.0:  # also rejects NaN
        raise ValueError(f"unseen must be 'hardest' or a float in [0, 1], got {unseen=!r}")
    return float(unseen)


def passk_classifier(
    num_prompts: int,
    edges: Sequence[float] = DEFAULT_EDGES,
    window: int = 8,
    statistic: str = "pass_at_k",
    k: int = 8,
    hysteresis: float = 0.0,
    unseen: str | float = "hardest",
) -> PassKClassifier:
    """Builds the online difficulty classifier over `num_prompts` prompts.

    Per prompt, `p_hat` is the mean of its last `min(visits, H)` per-visit statistics (`H = 0`:
    of all its visits). The raw bin is the number of edges `e_j` with `p_hat >= e_j`. With
    hysteresis `delta`, a prompt in bin `b` moves up only past the upper edges it clears by
    `delta` (`p_hat >= e_j + delta`), and down only past the lower edges it falls under by
    `delta` (`p_hat <= e_j - delta`, never below its raw bin, which matters only at `delta = 0`).
    A tie at `e_j + delta` or `e_j - delta` moves the prompt, as in the authors' released code
    (SPEC 3). A multi-bin jump goes as far as the edges so cleared, testing each edge crossed;
    the released code tests only the far bin's edge, so with `delta = 0.05` a prompt first seen
    at `p_hat = 1` stays in its easiest bin at `p_hat = 0.5` there and moves here. A prompt seen
    for the first time takes its raw bin. All comparisons count a value within `TIE_TOLERANCE`
    (1e-6) of a threshold as on it, so exact ties do not depend on rounding.

    Duplicate ids in one batch are pooled into a single visit, deterministically: their
    `num_correct` and `num_rollouts` are summed and the statistic is computed once, as if the
    prompt had been sampled once with all those rollouts. A pooled visit with no rollouts is no
    visit. Entries with `valid=False`, `num_rollouts <= 0` or an id outside `[0, D)` are ignored.

    Unseen prompts (no recorded visit): with `unseen="hardest"` (what the authors' released code
    does) they sit in bin 0 and their `p_hat` is 0.0; with a prior `unseen=p0` they sit in the
    bin of `p0` and their `p_hat` is `p0`. Ids outside `[0, D)` are reported as unseen.

    Args:
      num_prompts: dataset size `D >= 1`; prompts are keyed by their index `0..D-1`.
      edges: strictly ascending bin edges inside (0, 1); `B = len(edges) + 1` bins (default
        0.1, ..., 0.9, so `B = 10`). An empty sequence gives a single bin.
      window: `H >= 0` visits kept per prompt in a ring buffer; 0 keeps cumulative sums.
      statistic: per-visit statistic: pass_at_k, any_correct or mean_accuracy. `"pass_at_k"`
        is the default, `"any_correct"` the authors' released code's (see
        `per_visit_statistic`).
      k: the `k >= 1` of pass@k (paper: 8).
      hysteresis: margin `delta` in [0, 1). A `delta` wider than half a bin keeps prompts in bins
        whose range they have left entirely; 1 or more would freeze every prompt in its first bin.
      unseen: `"hardest"` or a prior `p0` in [0, 1] for prompts never seen.

    Returns:
      A `PassKClassifier` of pure functions:
        `init() -> PassKState`;
        `bins(state, prompt_ids) -> int32[N]`, the last assigned bin (unseen: see above);
        `p_hat(state, prompt_ids) -> float32[N]`, the windowed mean statistic;
        `update(state, prompt_ids, num_correct, num_rollouts, *, valid=None) -> PassKState`,
        where `num_rollouts` may be a scalar (every prompt drew the same number).

    Raises:
      ValueError: naming the parameter and value when a hyperparameter is out of range.

    References:
      Panaganti et al., 2026 (arXiv 2601.19280). Chen et al., 2021 (arXiv 2107.03374), eq. 1.
    """
    num_prompts = _check_int("num_prompts", num_prompts, 1)
    edges = _check_edges(edges)
    window = _check_int("window", window, 0)
    _check_statistic(statistic, k)
    k = int(k)
    if (
        isinstance(hysteresis, bool)
        or not isinstance(hysteresis, (int, float, np.integer, np.floating))
        or not 0.0 <= hysteresis < 1.0  # also rejects NaN
    ):
        raise ValueError(f"hysteresis must be in [0, 1), got hysteresis={hysteresis!r}")
    hysteresis = float(hysteresis)
    unseen_p_hat = _check_unseen(unseen)

    num_bins = len(edges) + 1
    edges_64 = np.asarray(edges, np.float64)
    # Thresholds are formed in float64 and rounded once; numpy constants keep the factory free of
    # device arrays.
    raw_thresholds = (edges_64 - TIE_TOLERANCE).astype(np.float32)
    up_thresholds = (edges_64 + hysteresis - TIE_TOLERANCE).astype(np.float32)
    # A prompt stays above edge e only while p > e - delta (+ the tolerance): a tie moves it down.
    stay_thresholds = (edges_64 - hysteresis + TIE_TOLERANCE).astype(np.float32)
    unseen_bin = int(np.sum(np.float32(unseen_p_hat) >= raw_thresholds))
    slots = max(window, 1)

    def count_cleared(p_N: jax.Array, thresholds: np.ndarray) -> jax.Array:
        return jnp.sum(p_N[:, None] >= thresholds[None, :], axis=-1, dtype=jnp.int32)

    def mean_of_rows(rows_NH: jax.Array, visits_N: jax.Array) -> jax.Array:
        if window == 0:
            return rows_NH[:, 0] / jnp.maximum(visits_N, 1).astype(jnp.float32)
        stored_N = jnp.clip(visits_N, 1, window).astype(jnp.float32)
        return jnp.sum(rows_NH, axis=-1) / stored_N

    def as_ids(prompt_ids: ArrayLike) -> tuple[jax.Array, jax.Array, jax.Array]:
        ids_N = jnp.asarray(prompt_ids, jnp.int32)
        chex.assert_rank(ids_N, 1)
        in_range_N = (ids_N >= 0) & (ids_N < num_prompts)
        return ids_N, in_range_N, jnp.clip(ids_N, 0, num_prompts - 1)

    def init() -> PassKState:
        return PassKState(
            history=jnp.zeros((num_prompts, slots), jnp.float32),
            visits=jnp.zeros((num_prompts,), jnp.int32),
            last_bin=jnp.full((num_prompts,), -1, jnp.int32),
        )

    def bins(state: PassKState, prompt_ids: ArrayLike) -> jax.Array:
        _, in_range_N, safe_N = as_ids(prompt_ids)
        last_N = jnp.take(state.last_bin, safe_N, axis=0)
        return jnp.where(in_range_N & (last_N >= 0), last_N, unseen_bin).astype(jnp.int32)

    def p_hat(state: PassKState, prompt_ids: ArrayLike) -> jax.Array:
        _, in_range_N, safe_N = as_ids(prompt_ids)
        visits_N = jnp.take(state.visits, safe_N, axis=0)
        p_N = mean_of_rows(jnp.take(state.history, safe_N, axis=0), visits_N)
        return jnp.where(in_range_N & (visits_N > 0), p_N, unseen_p_hat).astype(jnp.float32)

    def update(
        state: PassKState,
        prompt_ids: ArrayLike,
        *,
        num_correct: ArrayLike,
        num_rollouts: ArrayLike,
        valid: ArrayLike | None = None,
    ) -> PassKState:
        ids_N, in_range_N, _ = as_ids(prompt_ids)
        size = ids_N.shape[0]
        if size == 0:
            return state
        rollouts_N = jnp.maximum(jnp.broadcast_to(jnp.asarray(num_rollouts, jnp.int32), (size,)), 0)
        correct_N = jnp.clip(
            jnp.broadcast_to(jnp.asarray(num_correct, jnp.int32), (size,)), 0, rollouts_N
        )
        keep_N = in_range_N & (rollouts_N > 0)
        if valid is not None:
            keep_N &= jnp.broadcast_to(jnp.asarray(valid, bool), (size,))

        # Pool duplicate ids: sort the batch (dropped entries share the key D), then reduce each
        # run of equal keys. Every kept prompt ends up in exactly one segment, so the scatters
        # below never write one row twice and the result does not depend on scatter order.
        key_N = jnp.where(keep_N, ids_N, num_prompts)
        order_N = jnp.argsort(key_N, stable=True)
        sorted_key_N = key_N[order_N]
        run_start_N = jnp.concatenate([jnp.ones((1,), bool), sorted_key_N[1:] != sorted_key_N[:-1]])
        segment_N = jnp.cumsum(run_start_N, dtype=jnp.int32) - 1
        pooled = dict(num_segments=size, indices_are_sorted=True)
        correct_S = jax.ops.segment_sum(
            jnp.where(keep_N, correct_N, 0)[order_N], segment_N, **pooled
        )
        rollouts_S = jax.ops.segment_sum(
            jnp.where(keep_N, rollouts_N, 0)[order_N], segment_N, **pooled
        )
        # Unused segments take int32's minimum (the identity of max) and are dropped with key D.
        id_S = jax.ops.segment_max(sorted_key_N, segment_N, **pooled)
        observed_S = (id_S >= 0) & (id_S < num_prompts)
        target_S = jnp.where(observed_S, id_S, num_prompts)  # out of bounds: dropped by scatters
        safe_S = jnp.clip(id_S, 0, num_prompts - 1)

        statistic_S = per_visit_statistic(correct_S, rollouts_S, statistic=statistic, k=k)
        visits_S = jnp.take(state.visits, safe_S, axis=0)
        rows_SH = jnp.take(state.history, safe_S, axis=0)
        if window == 0:
            rows_SH = rows_SH + statistic_S[:, None]
        else:
            slot_S = visits_S % window
            is_slot_SH = jnp.arange(window, dtype=jnp.int32)[None, :] == slot_S[:, None]
            rows_SH = jnp.where(is_slot_SH, statistic_S[:, None], rows_SH)
        visits_S = visits_S + 1
        p_S = mean_of_rows(rows_SH, visits_S)

        previous_S = jnp.take(state.last_bin, safe_S, axis=0)
        # up_S: the highest bin whose lower edge p clears by delta (the farthest a move up goes);
        # down_S: the highest bin whose lower edge p is above by more than delta (where a move
        # down stops), never below the raw bin. Clipping the previous bin into [up_S, down_S] is
        # the hysteresis rule; up_S <= raw_S <= down_S always, and all three are equal when
        # delta = 0 (the max with raw_S keeps a p on an edge in the upper bin there).
        up_S = count_cleared(p_S, up_thresholds)
        raw_S = count_cleared(p_S, raw_thresholds)
        stay_S = jnp.sum(p_S[:, None] > stay_thresholds[None, :], axis=-1, dtype=jnp.int32)
        down_S = jnp.maximum(stay_S, raw_S)
        bin_S = jnp.where(previous_S < 0, raw_S, jnp.clip(previous_S, up_S, down_S))

        return state._replace(
            history=state.history.at[target_S].set(rows_SH, mode="drop"),
            visits=state.visits.at[target_S].set(visits_S, mode="drop"),
            last_bin=state.last_bin.at[target_S].set(bin_S.astype(jnp.int32), mode="drop"),
        )

    return PassKClassifier(
        init=init,
        bins=bins,
        p_hat=p_hat,
        update=update,
        num_bins=num_bins,
        edges=edges,
        num_prompts=num_prompts,
    )


__all__ = [
    "DEFAULT_EDGES",
    "STATISTICS",
    "TIE_TOLERANCE",
    "PassKClassifier",
    "PassKState",
    "passk_classifier",
    "per_visit_statistic",
]
