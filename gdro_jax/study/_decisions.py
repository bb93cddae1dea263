"""What a run's method decided, read back from its `metrics.jsonl` rows: does each of the field's
rivals do what its paper says?

- Knapsack-RL: rollouts per prompt that differ and sum to R every step; the share of groups
  with a non-zero gradient (its headline figure) over the run.
- MoPPS: the share of the batch whose previous visit was mixed (some rollouts right, some
  wrong) or all right, against the same shares for another run's batches (GRPO's uniform
  draw); the mean sampled success rate of the drawn prompts against its target.
- DAPO dynamic sampling: every kept group carries a signal; the kept fraction, the rounds and
  the optimizer updates.

Every figure comes from the per-prompt columns the trainer logs (`prompt/ids`,
`prompt/rollouts`, `prompt/correct`, `prompt/estimate`, `prompt/kept`) and the scalars
(`nonzero_advantage_fraction`, `filter/*`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np


def decision_summary(rows: Sequence[dict[str, Any]], *, after_step: int = 0) -> dict[str, Any]:
    """The decisions of one run, from its metrics rows (steps after `after_step` count for the
    means; the visit history is read from every row).

    Returns:
      A JSON-ready dict: `steps`, `rollouts_sum_equal` (every step's rollouts sum to the same R),
      `steps_with_unequal_rollouts`, `nonzero_gradient_fraction` (mean over the counted steps),
      `batch_share_previously_mixed` / `batch_share_previously_solved` (of the prompts drawn
      again, the share whose previous visit was mixed / all right), `mean_estimate` (the
      method's own success-rate estimate of the drawn prompts, when logged), and under a group
      filter `kept_groups`, `kept_without_signal`, `kept_fraction`, `updates`, `partial_updates`.
    """
    counted = [row for row in rows if row["step"] > after_step]
    if not counted:
        raise ValueError(f"no metrics rows after step {after_step} (of {len(rows)} rows)")
    totals = {int(np.sum(row["prompt/rollouts"])) for row in rows}
    summary: dict[str, Any] = {
        "steps": len(counted),
        "rollouts_sum_equal": len(totals) == 1,
        "steps_with_unequal_rollouts": sum(len(set(row["prompt/rollouts"])) > 1 for row in counted),
        "nonzero_gradient_fraction": float(
            np.mean([row["nonzero_advantage_fraction"] for row in counted])
        ),
    }
    previous: dict[int, tuple[int, int]] = {}  # prompt -> (correct, rollouts) of its last visit
    mixed, solved, revisits = 0, 0, 0
    for row in rows:
        triples = zip(row["prompt/ids"], row["prompt/correct"], row["prompt/rollouts"], strict=True)
        if row["step"] > after_step:
            for prompt in row["prompt/ids"]:
                if prompt in previous:
                    correct, rollouts = previous[prompt]
                    revisits += 1
                    mixed += 0 < correct < rollouts
                    solved += correct == rollouts
        for prompt, correct, rollouts in triples:
            previous[prompt] = (correct, rollouts)
    summary["batch_share_previously_mixed"] = mixed / revisits if revisits else None
    summary["batch_share_previously_solved"] = solved / revisits if revisits else None
    if "prompt/estimate" in counted[0]:
        summary["mean_estimate"] = float(np.mean([np.mean(r["prompt/estimate"]) for r in counted]))
    if "prompt/kept" in counted[0]:
        kept = without = 0
        for row in counted:
            kept_N = np.asarray(row["prompt/kept"], bool)
            correct, rollouts = (
                np.asarray(row["prompt/correct"]),
                np.asarray(row["prompt/rollouts"]),
            )
            kept += int(kept_N.sum())
            without += int(np.sum(kept_N & ((correct == 0) | (correct == rollouts))))
        summary.update(
            kept_groups=kept,
            kept_without_signal=without,
            kept_fraction=float(np.mean([row["filter/kept_fraction"] for row in counted])),
            updates=int(sum(row["filter/updated"] for row in counted)),
            # Dynamic sampling's buffers taken short of N groups (Pilot-Commit has none).
            partial_updates=int(sum(row.get("filter/partial", 0) for row in counted)),
        )
    return summary
