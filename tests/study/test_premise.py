"""The premise criteria (`study.premise_criteria`) against hand-computed values on tiny inputs."""

import numpy as np
import pytest

from experiments.configs import chain_setup, graded, pretrain_graded
from gdro_jax import configs, study, tasks

# Two problems per level on levels 1-3, 4 samples each: success 1, .75 | .5, .25 | 0, .25.
EVALUATION = {
    "num_samples": 4,
    "correct": [4, 3, 2, 1, 0, 1],
    "problem_levels": [1, 1, 2, 2, 3, 3],
}


def _row(step, prompts, nonzero):
    return {"step": step, "bin/prompts": prompts, "nonzero_advantage_fraction": nonzero}


# Five bins. Steps 29 and 30 lie in the first pass (all prompts unseen: bin 0) and are left out
# with after_step=30; steps 31 and 32 count.
ROWS = [
    _row(29, [8, 0, 0, 0, 0], 0.0),
    _row(30, [8, 0, 0, 0, 0], 0.1),
    _row(31, [1, 2, 1, 0, 4], 0.5),
    _row(32, [1, 0, 1, 2, 4], 0.3),
]
# Steps 31-32 pooled: [2, 2, 2, 2, 8] / 16.
SHARES = [2 / 16, 2 / 16, 2 / 16, 2 / 16, 8 / 16]
FALLING = [0.5, 0.3, 0.2]


def _by_name(criteria):
    return {c.name: c for c in criteria}


def test_bin_shares_pool_only_the_steps_after_the_first_pass():
    # Fails if rows with step <= after_step are counted (bin 0 would gain 16 of 32 prompts).
    np.testing.assert_allclose(study.bin_shares(ROWS, after_step=30), SHARES, atol=1e-12)
    # after_step=29 keeps step 30: [10, 2, 2, 2, 8] / 24.
    np.testing.assert_allclose(
        study.bin_shares(ROWS, after_step=29), np.array([10, 2, 2, 2, 8]) / 24, atol=1e-12
    )


def test_the_middle_bins_are_1_to_b_minus_2():
    # Bins 1, 2, 3 of five: 6/16. Including bin 0 or bin 4 gives 8/16 or 14/16.
    criteria = _by_name(study.premise_criteria(EVALUATION, ROWS, FALLING))
    assert criteria["bins_middle"].value == pytest.approx(6 / 16, abs=1e-12)
    assert criteria["bins_middle"].holds  # 0.375 >= 0.25
    assert criteria["bins_max"].value == pytest.approx(0.5, abs=1e-12)
    assert criteria["bins_max"].holds  # 0.5 <= 0.6


def test_the_all_equal_share_is_one_minus_the_mean_signal_after_the_first_pass():
    # 1 - mean(0.5, 0.3) = 0.6 (holds: <= 0.6); with steps 29-30 it would be 1 - 0.225 = 0.775.
    criteria = _by_name(study.premise_criteria(EVALUATION, ROWS, FALLING))
    assert criteria["all_equal"].value == pytest.approx(0.6, abs=1e-12)
    assert criteria["all_equal"].holds
    assert study.all_equal_share(ROWS, after_step=29) == pytest.approx(
        1 - (0.1 + 0.5 + 0.3) / 3, abs=1e-12
    )


def test_level_pass_at_1_is_the_mean_success_of_the_level_problems():
    assert study.level_pass_at_1(EVALUATION) == pytest.approx(
        {1: 0.875, 2: 0.375, 3: 0.125}, abs=1e-12
    )


def test_graded_levels_count_pass_at_1_within_the_closed_range():
    # Pass@1 0.875 (out), 0.375 and 0.125 (in): 2 levels, fewer than 3.
    criteria = _by_name(study.premise_criteria(EVALUATION, ROWS, FALLING))
    assert criteria["graded_levels"].value == 2.0
    assert not criteria["graded_levels"].holds
    # Level 1 at exactly 0.8 (4 of 5 samples) and level 3 at 0.2 count: the range is closed.
    edge = {"num_samples": 5, "correct": [4, 2, 1], "problem_levels": [1, 2, 3]}
    assert _by_name(study.premise_criteria(edge, ROWS, FALLING))["graded_levels"].value == 3.0


@pytest.mark.parametrize(("hardest_correct", "holds"), [(0, False), (1, True), (2, False)])
def test_the_hardest_level_must_lie_strictly_between_0_and_0_05(hardest_correct, holds):
    # 40 samples of one level-3 problem: 0, 1/40 = 0.025, 2/40 = 0.05 (the edge fails).
    evaluation = {
        "num_samples": 40,
        "correct": [40, 20, hardest_correct],
        "problem_levels": [1, 2, 3],
    }
    criterion = _by_name(study.premise_criteria(evaluation, ROWS, FALLING))["hardest_level"]
    assert criterion.value == pytest.approx(hardest_correct / 40, abs=1e-12)
    assert criterion.holds is holds


def test_the_heavy_tail_needs_a_fall_at_every_level():
    assert _by_name(study.premise_criteria(EVALUATION, ROWS, FALLING))["heavy_tail"].holds
    tie = _by_name(study.premise_criteria(EVALUATION, ROWS, [0.4, 0.3, 0.3]))["heavy_tail"]
    assert not tie.holds
    assert tie.value == pytest.approx(0.5, abs=1e-12)  # one fall of two steps


def test_pool_level_shares_are_the_pool_counts_over_its_size():
    task = tasks.ChainTaskConfig(num_levels=6, tail_base=2.0, pool_size=69)
    # 63 prompts beyond the 6 guaranteed: 2^-l shares of 63 = 32, 16, 8, 4, 2, 1 (exact).
    expected = (np.array([32, 16, 8, 4, 2, 1]) + 1) / 69
    np.testing.assert_allclose(study.pool_level_shares(task), expected, atol=1e-12)


def test_no_row_after_the_first_pass_is_an_error():
    with pytest.raises(ValueError, match="after_step=40"):
        study.bin_shares(ROWS, after_step=40)


def test_the_table_has_one_row_per_criterion_and_one_column_per_profile():
    criteria = study.premise_criteria(EVALUATION, ROWS, FALLING)
    table = study.format_criteria({"a": criteria, "b": criteria})
    lines = table.splitlines()
    assert len(lines) == 2 + len(criteria)
    assert lines[0] == "| criterion | threshold | a | b |"
    # Steps 31-32 pooled hold at 0.600; step 32 alone has 0.7 of its groups all-equal.
    shown = "0.600 (holds; 1 of 2 batches fail)"
    assert f"| all_equal | <= 0.6 | {shown} | {shown} |" in lines


# Pooled over steps 31-32 the bins hold ([4, 2, 2, 0, 8] / 16: largest 0.5, middle 0.25), while
# step 31 alone has all its prompts in bin 4 (share 1.0, no middle bin).
SPLIT_ROWS = [
    _row(30, [8, 0, 0, 0, 0], 0.0),
    _row(31, [0, 0, 0, 0, 8], 0.2),
    _row(32, [4, 2, 2, 0, 0], 0.6),
]


def test_the_pooled_bin_criteria_are_also_counted_batch_by_batch():
    criteria = _by_name(study.premise_criteria(EVALUATION, SPLIT_ROWS, FALLING))
    assert criteria["bins_max"].value == pytest.approx(0.5, abs=1e-12)
    assert criteria["bins_max"].holds
    assert criteria["bins_max"].batches_failing == (1, 2)  # step 31: 8 of 8 prompts in one bin
    assert criteria["bins_middle"].holds  # 4 / 16 >= 0.25
    assert criteria["bins_middle"].batches_failing == (1, 2)  # step 31: 0 in the middle bins
    # All-equal 0.8 and 0.4: the mean 0.6 holds, step 31 alone fails.
    assert criteria["all_equal"].batches_failing == (1, 2)
    # Criteria measured once, not per step, carry no batch count.
    assert criteria["graded_levels"].batches_failing is None
    assert study.batches_failing(SPLIT_ROWS, after_step=29) == {
        "bins_max": 2,  # step 30: all 8 prompts in bin 0
        "bins_middle": 2,
        "all_equal": 2,  # step 30: every group all-equal
        "batches": 3,
    }


def test_the_figure_has_two_panels_per_profile():
    fig = study.plot_premise({"a": (EVALUATION, ROWS), "b": (EVALUATION, ROWS)})
    assert len(fig.axes) == 4
    heights = [patch.get_height() for patch in fig.axes[2].patches]
    np.testing.assert_allclose(heights, SHARES, atol=1e-12)


def _field_names(tree, prefix=""):
    names = set()
    for name, value in tree.items():
        if isinstance(value, dict):
            names |= _field_names(value, f"{prefix}{name}.")
        else:
            names.add(f"{prefix}{name}")
    return names


def test_the_cliff_task_is_unchanged_by_the_graded_profile():
    # The study's results depend on these values (issue 16: the cliff stays as it is).
    assert chain_setup.task().to_dict() == dict(
        num_levels=8,
        tail_base=1.5,
        pool_size=384,
        validation_per_level=32,
        test_per_level=100,
        seed=0,
    )
    assert chain_setup.task(test_per_level=(5,) * 8).test_per_level == (5,) * 8
    with pytest.raises(ValueError, match="profile="):
        chain_setup.task(profile="steep")


def test_the_graded_run_and_warm_start_share_one_task_and_hold_every_field():
    run, warm = graded.get_config(), pretrain_graded.get_config()
    assert _field_names(run.to_dict()) == {n for n, _, _ in configs.describe(configs.run_schema())}
    assert run.task.to_dict() == warm.task.to_dict()
    task = configs.chain_task_config(run)
    assert run.max_new_tokens == task.max_solution_length
    assert task.max_prompt_length + task.max_solution_length <= run.model.max_position_embeddings
    assert run.num_prompts * run.n_mean == 128  # the cliff's 32 x 4 rollout slots
    assert task.pool_size == 30 * run.num_prompts  # the first pass ends at step 30
    assert study.premise_criteria(EVALUATION, ROWS, study.pool_level_shares(task))[-1].holds
