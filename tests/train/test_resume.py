"""Exact resume of real training processes: killed, preempted, or with a damaged checkpoint.

Every run is a subprocess of `experiments/train.py` (through `tests/train/_resume_child.py`, which
adds a reward a random policy earns and the kill hooks) on the tiny config in
`_resume_config.py`: 8 steps, a checkpoint every step, the last two kept. For
`dynamic_sampling` (whose state holds the buffer of groups waiting for an update), `pilot_commit`
(its replay buffer of piloted prompts, deferrals and evictions) and `gdro_both` (whose state holds
every controller's: classifier, Prompt-GDRO and Rollout-GDRO) an
uninterrupted run is compared with a run SIGKILLed right after step 4's checkpoint and resumed:
the metrics rows (all but `time/*`) and every leaf of the final state must be bit-identical.
Copies of the killed `gdro_both` run are resumed and interrupted once more, differently:

    corrupt   step 4's checkpoint garbled: resumes from step 3
    in_save   SIGKILLed inside the write of step 6's checkpoint: resumes from step 5
    sigterm   SIGTERM during step 6 (checkpoints every 100 steps): step 6 saved, exit 143

and each must still end bit-identical to the uninterrupted run. The processes of a phase run
concurrently; they share a JAX compilation cache, so only the uninterrupted runs compile.
"""

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys

import numpy as np
import orbax.checkpoint as ocp
import pytest
import safetensors.numpy

from gdro_jax.train import read_metrics
from tests._subprocesses import finish

pytestmark = pytest.mark.slow
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CONFIG = os.path.join("tests", "train", "_resume_config.py")
TIMEOUT_S = 600


def _start(workdir, method, *flags, **hooks):
    env = dict(os.environ)
    env.update({name: str(value) for name, value in hooks.items()})
    command = [
        sys.executable,
        "-m",
        "tests.train._resume_child",
        f"--config={CONFIG}",
        f"--workdir={workdir}",
        f"--config.method={method}",
        *flags,
    ]
    log = open(f"{workdir}.log", "w")  # noqa: SIM115 (closed in _wait)
    process = subprocess.Popen(command, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    return process, log, f"{workdir}.log"


def _phase(*jobs):
    """Runs the jobs (`_start` arguments) concurrently; returns `(returncode, log text)` each."""
    started = [_start(*job[0], **job[1]) for job in jobs]
    results = []
    for process, log, path in started:
        try:
            code = finish(process, TIMEOUT_S)
        finally:
            log.close()
        with open(path, encoding="utf-8") as file:
            results.append((code, file.read()))
    return results


def _job(workdir, method, *flags, **hooks):
    return ((workdir, method, *flags), hooks)


def _snapshot(folder):
    """Every file under `folder` and the hash of its bytes."""
    files = {}
    for root, _, names in os.walk(folder):
        for name in names:
            path = os.path.join(root, name)
            with open(path, "rb") as file:
                files[os.path.relpath(path, folder)] = hashlib.sha256(file.read()).hexdigest()
    return files


# Dynamic sampling's state adds the buffer of groups waiting for an update; Pilot-Commit's its
# replay buffer; gdro_both's every controller's. (GRPO's state is a part of all three.)
RESUMED = ("dynamic_sampling", "pilot_commit", "gdro_both")


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    base = tmp_path_factory.mktemp("resume")
    cache = {
        "JAX_COMPILATION_CACHE_DIR": base / "jax_cache",
        "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": 0,
        "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": 0,
    }
    full = {m: base / f"{m}_full" for m in RESUMED}
    killed = {m: base / f"{m}_resumed" for m in RESUMED}
    out = {"full": full, "resumed": killed, "base": base}

    # Phase 1: the uninterrupted runs (they fill the compilation cache).
    out["full_rc"] = _phase(*[_job(full[m], m, **cache) for m in RESUMED])
    # Phase 2: the runs killed right after step 4's checkpoint.
    out["killed_rc"] = _phase(
        *[_job(killed[m], m, GDRO_TEST_KILL_AFTER_SAVE=4, **cache) for m in RESUMED]
    )
    out["killed_metrics"] = {m: (killed[m] / "metrics.jsonl").read_bytes() for m in RESUMED}
    out["killed_steps"] = {m: sorted(os.listdir(killed[m] / "checkpoints")) for m in RESUMED}

    copies = {name: base / f"gdro_both_{name}" for name in ("corrupt", "in_save", "sigterm")}
    for copy in copies.values():
        shutil.copytree(killed["gdro_both"], copy)
    for root, _, names in os.walk(copies["corrupt"] / "checkpoints" / "4" / "state"):
        if os.path.basename(root) == "d":
            for name in names:
                path = os.path.join(root, name)
                os.truncate(path, os.path.getsize(path) // 2)
    refused = base / "dynamic_sampling_refused"
    shutil.copytree(killed["dynamic_sampling"], refused)
    out["refused_before"] = _snapshot(refused)
    out["copies"], out["refused"] = copies, refused

    # Phase 3: resumes (two of them interrupted again), the damaged copy, a changed config.
    results = _phase(
        _job(killed["dynamic_sampling"], "dynamic_sampling", **cache),
        _job(killed["pilot_commit"], "pilot_commit", **cache),
        _job(killed["gdro_both"], "gdro_both", **cache),
        _job(copies["corrupt"], "gdro_both", **cache),
        _job(copies["in_save"], "gdro_both", GDRO_TEST_KILL_IN_SAVE=6, **cache),
        _job(
            copies["sigterm"],
            "gdro_both",
            "--config.checkpoint.every_steps=100",
            GDRO_TEST_SIGTERM_IN_STEP=6,
            **cache,
        ),
        _job(refused, "dynamic_sampling", "--config.optimizer.learning_rate=0.5", **cache),
    )
    names = ["dynamic_sampling", "pilot_commit", "gdro_both", "corrupt", "in_save", "sigterm",
             "refused"]  # fmt: skip
    out["phase3"] = dict(zip(names, results, strict=True))
    out["in_save_after_kill"] = sorted(os.listdir(copies["in_save"] / "checkpoints"))
    out["sigterm_after_term"] = sorted(os.listdir(copies["sigterm"] / "checkpoints"))

    # Phase 4: the second resumes, and a rerun of a finished workdir.
    out["full_before_rerun"] = _snapshot(full["gdro_both"])
    results = _phase(
        _job(copies["in_save"], "gdro_both", **cache),
        _job(copies["sigterm"], "gdro_both", **cache),
        _job(full["gdro_both"], "gdro_both", **cache),
    )
    out["phase4"] = dict(zip(["in_save", "sigterm", "rerun"], results, strict=True))
    return out


def _rows(workdir):
    rows = read_metrics(workdir / "metrics.jsonl")
    return [{k: v for k, v in row.items() if not k.startswith("time/")} for row in rows]


def _final_state(workdir):
    """Every leaf of the step-8 checkpoint (params, optimizer, controllers, key, step, ...)."""
    with ocp.StandardCheckpointer() as checkpointer:
        state = checkpointer.restore(workdir / "checkpoints" / "8" / "state")
    leaves = {}

    def walk(node, prefix):
        for name, value in node.items():
            if isinstance(value, dict):
                walk(value, f"{prefix}{name}/")
            else:
                leaves[prefix + name] = np.asarray(value)

    walk(state, "")
    return leaves


def _assert_same_run(workdir, reference):
    rows, expected = _rows(workdir), _rows(reference)
    assert [r["step"] for r in rows] == list(range(1, 9))
    assert rows == expected
    got, want = _final_state(workdir), _final_state(reference)
    assert sorted(got) == sorted(want)
    assert any(name.startswith("ref_params/") for name in got)
    for name in want:
        assert got[name].dtype == want[name].dtype, name
        assert np.array_equal(got[name], want[name]), name
    params = safetensors.numpy.load_file(str(workdir / "model" / "model.safetensors"))
    reference_params = safetensors.numpy.load_file(str(reference / "model" / "model.safetensors"))
    assert sorted(params) == sorted(reference_params)
    for name, value in reference_params.items():
        assert np.array_equal(params[name], value), name


def test_the_uninterrupted_runs_learn_something(runs):
    assert [rc for rc, _ in runs["full_rc"]] == [0] * len(RESUMED), runs["full_rc"]
    for method in RESUMED:
        rows = _rows(runs["full"][method])
        assert len(rows) == 8
        assert any(row["grad_norm"] > 0 for row in rows), "the parity reward moves the policy"
        assert len({row["reward"] for row in rows}) > 1
    # The kill after step 4 leaves groups waiting in the buffer (restored with the state).
    rows = _rows(runs["full"]["dynamic_sampling"])
    assert rows[3]["filter/buffered"] > 0 and sum(row["filter/updated"] for row in rows) >= 2
    # And piloted prompts waiting for their commit, some of them committed after the resume.
    rows = _rows(runs["full"]["pilot_commit"])
    assert rows[3]["filter/buffered"] > 0 and sum(row["filter/committed"] for row in rows[4:]) > 0


def test_the_killed_runs_died_by_sigkill_after_step_4(runs):
    for method, (rc, log) in zip(RESUMED, runs["killed_rc"], strict=True):
        assert rc == -signal.SIGKILL, (method, log[-3000:])
        assert runs["killed_steps"][method] == ["3", "4"], "keep=2: the last two checkpoints"
        full = (runs["full"][method] / "metrics.jsonl").read_bytes().splitlines(keepends=True)
        killed = runs["killed_metrics"][method].splitlines(keepends=True)
        assert [json.loads(line)["step"] for line in killed] == [1, 2, 3, 4]
        assert len(full) == 8


@pytest.mark.parametrize("method", RESUMED)
def test_kill_and_resume_is_bit_identical_to_an_uninterrupted_run(runs, method):
    rc, log = runs["phase3"][method]
    assert rc == 0, log[-3000:]
    workdir = runs["resumed"][method]
    _assert_same_run(workdir, runs["full"][method])
    # The rows written before the kill are kept byte for byte.
    assert (workdir / "metrics.jsonl").read_bytes().startswith(runs["killed_metrics"][method])


def test_sigkill_inside_a_checkpoint_write_resumes_from_the_last_complete_one(runs):
    rc, log = runs["phase3"]["in_save"]
    assert rc == -signal.SIGKILL, log[-3000:]
    assert "5" in runs["in_save_after_kill"]
    assert "6" not in runs["in_save_after_kill"]
    assert any(name.startswith("6.") for name in runs["in_save_after_kill"]), (
        "the killed save left its temporary folder"
    )
    rc, log = runs["phase4"]["in_save"]
    assert rc == 0, log[-3000:]
    workdir = runs["copies"]["in_save"]
    assert f"resuming from {workdir / 'checkpoints' / '5'}" in log
    final = sorted(os.listdir(workdir / "checkpoints"))
    assert final == ["7", "8"], "the temporary folder was cleaned up"
    _assert_same_run(workdir, runs["full"]["gdro_both"])


def test_sigterm_saves_the_step_reached_and_exits_cleanly(runs):
    rc, log = runs["phase3"]["sigterm"]
    assert rc == 128 + signal.SIGTERM, log[-3000:]
    assert "SIGTERM: stopped after step 6 of " in log
    assert log.rstrip().splitlines()[-1].startswith("to resume, run the same command again: ")
    assert "Traceback" not in log
    assert runs["sigterm_after_term"] == ["4", "6"], "saved on the signal, not by the cadence"
    rc, log = runs["phase4"]["sigterm"]
    assert rc == 0, log[-3000:]
    workdir = runs["copies"]["sigterm"]
    assert f"resuming from {workdir / 'checkpoints' / '6'}" in log
    _assert_same_run(workdir, runs["full"]["gdro_both"])


def test_a_corrupt_checkpoint_is_named_and_the_run_resumes_from_the_previous_one(runs):
    rc, log = runs["phase3"]["corrupt"]
    assert rc == 0, log[-3000:]
    corrupt = runs["copies"]["corrupt"]
    assert f"checkpoint {corrupt / 'checkpoints' / '4'} cannot be restored" in log
    assert f"resuming from {corrupt / 'checkpoints' / '3'}" in log
    assert os.path.isdir(corrupt / "checkpoints_corrupt" / "4"), "kept for inspection"
    _assert_same_run(corrupt, runs["full"]["gdro_both"])


def test_a_changed_config_is_refused_and_the_workdir_left_untouched(runs):
    rc, log = runs["phase3"]["refused"]
    assert rc != 0
    assert "optimizer.learning_rate: saved 0.01, now 0.5" in log
    assert str(runs["refused"] / "checkpoints" / "4") in log
    assert _snapshot(runs["refused"]) == runs["refused_before"]


def test_a_finished_workdir_returns_at_once_unchanged(runs):
    rc, log = runs["phase4"]["rerun"]
    assert rc == 0, log[-3000:]
    assert _snapshot(runs["full"]["gdro_both"]) == runs["full_before_rerun"]
