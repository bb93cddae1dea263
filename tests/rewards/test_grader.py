"""Tests of MathGrader: agreement with the labelled completions (every disagreement reviewed in
grader_disagreements.json), the pool against in-process grading, pathological inputs, the hard
timeout, killed workers, and argument errors. One pool serves the module (workers take about a
second each to start)."""

import json
import os
import signal
from pathlib import Path

import pytest

from gdro_jax import rewards

DISAGREEMENTS_FILE = Path(__file__).with_name("grader_disagreements.json")
TIMEOUT_S = 1.5
# The labelled completions are graded for their verdicts, not their speed: one item takes 0.6 s
# alone and more on a loaded CI machine, so their pool's limit is far above any item's time.
LABELLED_TIMEOUT_S = 60.0


@pytest.fixture(scope="module")
def grader():
    with rewards.MathGrader(num_workers=2, timeout_s=TIMEOUT_S) as pool:
        yield pool


@pytest.fixture(scope="module")
def labelled_grades(labelled_completions):
    with rewards.MathGrader(num_workers=2, timeout_s=LABELLED_TIMEOUT_S) as pool:
        return pool.grade_items(
            [row["completion"] for row in labelled_completions],
            [row["answer"] for row in labelled_completions],
        )


def synthetic_items(count):
    """Completions boxing i, graded against i (correct) or i + 1 (wrong) for every third i."""
    completions = [
        f"We compute step by step... so the result is $\\boxed{{{i}}}$." for i in range(count)
    ]
    golds = [str(i + 1 if i % 3 == 0 else i) for i in range(count)]
    expected = [0.0 if i % 3 == 0 else 1.0 for i in range(count)]
    return completions, golds, expected


def stats_delta(after, before):
    return rewards.GraderStats(*(a - b for a, b in zip(after, before, strict=True)))


# ---- agreement with the labels --------------------------------------------------------------


def test_agreement_with_labels_and_reviewed_disagreements(labelled_completions, labelled_grades):
    assert len(labelled_grades) == len(labelled_completions) == 800
    assert all(grade.status not in (rewards.TIMEOUT, rewards.CRASH) for grade in labelled_grades)
    disagreements = {
        (row["id"], grade.score == 1.0, row["is_correct"])
        for row, grade in zip(labelled_completions, labelled_grades, strict=True)
        if (grade.score == 1.0) != row["is_correct"]
    }
    agreement = 1 - len(disagreements) / len(labelled_completions)
    assert agreement >= 0.99
    reviewed = json.loads(DISAGREEMENTS_FILE.read_text(encoding="utf-8"))
    assert all(entry["reason"].strip() for entry in reviewed)
    assert disagreements == {(entry["id"], entry["ours"], entry["label"]) for entry in reviewed}


def test_pool_agrees_with_in_process_grading(labelled_completions, labelled_grades):
    inline = [
        rewards.grade_completion(row["completion"], row["answer"]) for row in labelled_completions
    ]
    assert labelled_grades == inline


def test_grade_returns_scores_in_order(grader):
    completions, golds, expected = synthetic_items(40)
    assert grader.grade(completions, golds) == expected
    assert grader.grade([], []) == []


def test_progress_bar_can_be_shown(grader, capsys):
    completions, golds, expected = synthetic_items(5)
    assert grader.grade(completions, golds, progress=True) == expected
    assert "grading" in capsys.readouterr().err


# ---- pathological inputs ----------------------------------------------------------------------

PATHOLOGICAL = {
    # name: (completion, gold, acceptable statuses)
    "one_megabyte": ("word " * 200_000 + "so \\boxed{17}", "17", {rewards.CORRECT}),
    "power_tower": ("\\boxed{9^{9^{9^{9}}}}", "1", {rewards.TIMEOUT, rewards.WRONG}),
    "deep_braces": (
        "\\boxed{" + "{" * 20_000 + "1" + "}" * 20_000 + "}",
        "1",
        {rewards.TIMEOUT, rewards.WRONG, rewards.CORRECT},
    ),
    "unbalanced": ("{" * 50_000 + "\\boxed{" * 1_000 + "1", "1", {rewards.NO_ANSWER}),
    "megabyte_answer": ("\\boxed{" + "1+" * 300_000 + "1}", "1", {rewards.TIMEOUT, rewards.WRONG}),
    "no_answer": ("I could not solve this.", "1", {rewards.NO_ANSWER}),
}


def test_pathological_inputs_finish(grader):
    before = grader.stats
    names = sorted(PATHOLOGICAL)
    completions = [PATHOLOGICAL[name][0] for name in names] + synthetic_items(6)[0]
    golds = [PATHOLOGICAL[name][1] for name in names] + synthetic_items(6)[1]
    grades = grader.grade_items(completions, golds)
    for name, grade in zip(names, grades, strict=False):
        assert grade.status in PATHOLOGICAL[name][2], name
        assert grade.score == (1.0 if grade.status == rewards.CORRECT else 0.0)
    assert [grade.score for grade in grades[len(names) :]] == synthetic_items(6)[2]
    delta = stats_delta(grader.stats, before)
    assert delta.items == len(completions)
    assert delta.timeouts == sum(grade.status == rewards.TIMEOUT for grade in grades)


def test_hard_timeout_kills_and_replaces_the_worker():
    # Without the workers' own timer, only the parent's kill stops the power tower.
    with rewards.MathGrader(num_workers=1, timeout_s=1.0, soft_timeout=False) as pool:
        completions, golds, expected = synthetic_items(3)
        pool.wait_ready()
        first_pid = pool.pids[0]
        grades = pool.grade_items([PATHOLOGICAL["power_tower"][0], *completions], ["1", *golds])
        assert grades[0] == rewards.Grade(0.0, rewards.TIMEOUT)
        assert [grade.score for grade in grades[1:]] == expected
        assert pool.stats.timeouts == 1 and pool.stats.restarts == 1
        assert pool.pids[0] != first_pid


# ---- killed workers ---------------------------------------------------------------------------


def test_idle_worker_killed_is_replaced(grader):
    before = grader.stats
    victim = grader.pids[0]
    os.kill(victim, signal.SIGKILL)
    completions, golds, expected = synthetic_items(500)
    grades = grader.grade_items(completions, golds)
    assert len(grades) == 500
    delta = stats_delta(grader.stats, before)
    assert delta.restarts == 1 and victim not in grader.pids
    # The death is seen before the next item or, if the kill is still in flight, on that item.
    assert delta.crashes <= 1
    for grade, score in zip(grades, expected, strict=True):
        assert grade.score == score or grade.status == rewards.CRASH


def test_worker_killed_mid_batch_is_replaced(grader):
    before = grader.stats
    completions, golds, expected = synthetic_items(500)
    victims = []

    def completions_killing_at_item_100():
        for index, completion in enumerate(completions):
            if index == 100:
                victims.append(grader.pids[1])
                os.kill(victims[0], signal.SIGKILL)
            yield completion

    grades = grader.grade_items(completions_killing_at_item_100(), golds)
    assert len(grades) == 500
    delta = stats_delta(grader.stats, before)
    assert delta.restarts == 1 and victims[0] not in grader.pids
    assert delta.crashes <= 1 and delta.crashes == sum(g.status == rewards.CRASH for g in grades)
    for grade, score in zip(grades, expected, strict=True):
        assert grade.score == score or grade.status == rewards.CRASH


# ---- errors -----------------------------------------------------------------------------------


def test_unequal_lengths_raise_and_the_pool_still_works(grader):
    with pytest.raises(ValueError, match="same length, got 2 and 1"):
        grader.grade(["\\boxed{1}", "\\boxed{2}"], ["1"])
    with pytest.raises(ValueError):
        grader.grade(iter(["\\boxed{1}", "\\boxed{2}"]), iter(["1"]))
    completions, golds, expected = synthetic_items(10)
    assert grader.grade(completions, golds) == expected


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(num_workers=0), "num_workers=0"),
        (dict(timeout_s=0.0), "timeout_s=0.0"),
        (dict(max_in_flight=0), "max_in_flight=0"),
        (dict(kill_grace_s=-1.0), "kill_grace_s=-1.0"),
        (dict(memory_limit_mb=10), "memory_limit_mb=10"),
        (dict(startup_timeout_s=0), "startup_timeout_s=0"),
    ],
)
def test_invalid_arguments(kwargs, message):
    with pytest.raises(ValueError, match=message):
        rewards.MathGrader(**kwargs)


def test_closed_grader_refuses_work():
    pool = rewards.MathGrader(num_workers=1)
    pool.close()
    pool.close()
    with pytest.raises(RuntimeError, match="closed"):
        pool.grade(["\\boxed{1}"], ["1"])
    with pytest.raises(RuntimeError, match="closed"):
        pool.wait_ready()
