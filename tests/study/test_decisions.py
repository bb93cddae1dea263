"""`study.decision_summary` on hand-written metrics rows, against counts made by hand."""

import pytest

from gdro_jax import study


def _row(step, ids, correct, rollouts, nonzero, kept, updated):
    return {
        "step": step, "prompt/ids": ids, "prompt/correct": correct, "prompt/rollouts": rollouts,
        "nonzero_advantage_fraction": nonzero, "prompt/estimate": [0.5] * len(ids),
        "prompt/kept": kept, "filter/kept_fraction": sum(kept) / len(kept),
        "filter/updated": updated, "filter/partial": 0,
    }  # fmt: skip


ROWS = [
    _row(1, [0, 1], [2, 4], [4, 4], 0.5, [1, 0], 0),
    _row(2, [1, 2], [1, 0], [2, 6], 0.5, [1, 1], 1),  # prompt 1 back: last visit 4 of 4
    _row(3, [0, 1], [0, 2], [4, 4], 0.0, [0, 0], 0),  # 0 back (2 of 4), 1 back (1 of 2)
    _row(4, [2, 3], [1, 1], [4, 4], 1.0, [1, 1], 0),  # 2 back (0 of 6: neither)
]


def test_the_decisions_counted_by_hand():
    summary = study.decision_summary(ROWS)
    assert summary["steps"] == 4 and summary["rollouts_sum_equal"]
    assert summary["steps_with_unequal_rollouts"] == 1  # step 2: 2 and 6
    assert summary["nonzero_gradient_fraction"] == pytest.approx(2 / 4)
    # Four revisits: prompt 1 at step 2 (solved before), prompts 0 and 1 at step 3 (mixed),
    # prompt 2 at step 4 (none right before).
    assert summary["batch_share_previously_mixed"] == pytest.approx(2 / 4)
    assert summary["batch_share_previously_solved"] == pytest.approx(1 / 4)
    assert summary["mean_estimate"] == pytest.approx(0.5)
    # Kept: prompt 0 at step 1 (2 of 4), prompts 1 and 2 at step 2 (1 of 2; 0 of 6: no signal).
    assert summary["kept_groups"] == 5 and summary["kept_without_signal"] == 1
    assert summary["updates"] == 1 and summary["partial_updates"] == 0
    later = study.decision_summary(ROWS, after_step=2)  # the history still comes from every row
    assert later["steps"] == 2 and later["batch_share_previously_mixed"] == pytest.approx(2 / 3)
    with pytest.raises(ValueError, match="no metrics rows after step 4"):
        study.decision_summary(ROWS, after_step=4)
