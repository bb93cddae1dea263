"""Two real processes, one run: `experiments/train.py` under `jax.distributed` on this machine.

Each run trains the tiny resume config (`_resume_config.py`, parity reward, KL on) for 3 steps on
a 1 x 4 x 1 mesh (`fsdp=4`), so parameters and optimizer state are sharded across processes:

    reference    1 process with 4 fake CPU devices, the reward inside jit
    preempted    2 processes (gloo collectives) with 2 fake devices each, the same reward on the
                 host, each process grading the slots on its own devices; process 1 alone gets
                 SIGTERM during step 2: both processes agree to stop, checkpoint step 2 together
                 and exit 143 (killed by the scheduler)
    resumed      the preempted run started again: from step 2's checkpoint to the end

The two-process run, preempted and resumed, must equal `reference` up to float32 rounding: the
processes' all-reduce (gloo) sums in another order than XLA's in-process one, so losses and
gradients differ in the last bits (measured: <= 2e-7 relative); every discrete decision
(allocations, bins, rewards, accuracy) is identical, and a resume that lost any state (the key,
the optimizer's moments, a controller) would not be. (That a resume is bit-identical to an
uninterrupted run, after a SIGKILL too, `test_resume.py` checks in one process.)
"""

import json
import os
import signal
import subprocess
import sys

import numpy as np
import pytest
import safetensors.numpy

from tests._subprocesses import finish, free_port, xla_flags

pytestmark = pytest.mark.slow
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CONFIG = os.path.join("tests", "train", "_resume_config.py")
TIMEOUT_S = 600  # a hang guard: on 2 cores other tests' processes may run beside these
RTOL, ATOL = 1e-5, 1e-6  # float32 rounding of a different reduction order
# What the processes decided and sampled: equal exactly, not within a tolerance.
DISCRETE = {
    "accuracy",
    "reward",
    "response_length",
    "tokens",
    "nonzero_advantage_fraction",
    "bin/prompts",
    "bin/rollouts",
    "bin/rollouts_per_prompt",
    "bin/tokens",
}


def _command(workdir, *flags):
    return [
        sys.executable,
        "-m",
        "tests.train._resume_child",
        f"--config={CONFIG}",
        f"--workdir={workdir}",
        "--config.method=gdro_both",
        "--config.steps=3",
        "--config.mesh.data=1",
        "--config.mesh.fsdp=4",
        # Adam's eps at 1e-4: at 1e-8 its steps turn the last-bit differences of near-zero
        # gradient entries (another reduction order, once per packed pass) into parameter
        # differences of ~4e-6 after 3 steps at lr 1e-2; at 1e-4 parameters are compared at the
        # gradients' tolerance (as tests/train/test_grad_accumulation.py does).
        "--config.optimizer.eps=0.0001",
        *flags,
    ]


def _env(cache, devices, **hooks):
    env = dict(os.environ, XLA_FLAGS=xla_flags(xla_force_host_platform_device_count=devices))
    env.update(JAX_PLATFORMS="cpu", **cache)
    env.update({name: str(value) for name, value in hooks.items()})
    return env


def _run(workdir, cache, *, processes, hooks=None):
    """Runs one training run as `processes` processes; returns their exit codes and logs.
    Several processes score on the host, each its own slots."""
    hooks = hooks or [{}] * processes
    if processes > 1:
        hooks = [dict(hook, GDRO_TEST_HOST_REWARD=1) for hook in hooks]
    port = free_port()
    started = []
    for index in range(processes):
        flags = []
        if processes > 1:
            flags = [
                f"--coordinator_address=localhost:{port}",
                f"--num_processes={processes}",
                f"--process_id={index}",
            ]
        log = open(f"{workdir}.{index}.log", "w")  # noqa: SIM115 (closed below)
        env = _env(cache, 4 // processes, **hooks[index])
        process = subprocess.Popen(
            _command(workdir, *flags), cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT
        )
        started.append((process, log))
    codes, logs = [], []
    for index, (process, log) in enumerate(started):
        try:
            codes.append(finish(process, TIMEOUT_S))
        finally:
            log.close()
        with open(f"{workdir}.{index}.log", encoding="utf-8") as file:
            logs.append(file.read()[-3000:])
    return codes, logs


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    base = tmp_path_factory.mktemp("multiprocess")
    cache = {
        "JAX_COMPILATION_CACHE_DIR": str(base / "jax_cache"),
        "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
        "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "0",
    }
    out = {name: base / name for name in ("reference", "resumed")}
    out["reference_rc"] = _run(out["reference"], cache, processes=1)
    out["preempted_rc"] = _run(
        out["resumed"], cache, processes=2, hooks=[{}, {"GDRO_TEST_SIGTERM_IN_STEP": 2}]
    )
    out["after_preemption"] = sorted(os.listdir(out["resumed"] / "checkpoints"))
    out["preempted_rows"] = len(_rows(out["resumed"]))
    out["resumed_rc"] = _run(out["resumed"], cache, processes=2)
    return out


def _rows(workdir):
    with open(workdir / "metrics.jsonl", encoding="utf-8") as file:
        rows = [json.loads(line) for line in file]
    return [{k: v for k, v in row.items() if not k.startswith("time/")} for row in rows]


def _params(workdir):
    return safetensors.numpy.load_file(str(workdir / "model" / "model.safetensors"))


def test_every_run_finished(runs):
    for name in ("reference", "resumed"):
        codes, logs = runs[f"{name}_rc"]
        assert all(code == 0 for code in codes), (name, codes, logs)
        assert [row["step"] for row in _rows(runs[name])] == [1, 2, 3]


def test_two_processes_preempted_and_resumed_equal_one_process_on_as_many_devices(runs):
    rows, reference = _rows(runs["resumed"]), _rows(runs["reference"])
    assert [sorted(row) for row in rows] == [sorted(row) for row in reference]
    for row, expected in zip(rows, reference, strict=True):
        for name, value in expected.items():
            if isinstance(value, int) or name in DISCRETE:
                assert row[name] == value, (row["step"], name)
            else:
                np.testing.assert_allclose(
                    row[name], value, rtol=RTOL, atol=ATOL, err_msg=f"step {row['step']} {name}"
                )
    params, expected = _params(runs["resumed"]), _params(runs["reference"])
    assert sorted(params) == sorted(expected)
    for name, value in expected.items():
        np.testing.assert_allclose(params[name], value, rtol=RTOL, atol=ATOL, err_msg=name)


def test_a_signal_to_one_process_stops_both_at_the_same_checkpoint(runs):
    codes, logs = runs["preempted_rc"]
    assert codes == [128 + signal.SIGTERM] * 2, logs
    assert runs["after_preemption"] == ["1", "2"]  # every step is checkpointed, 2 kept
    assert runs["preempted_rows"] == 2


def test_only_process_0_writes_the_run_files(runs):
    # One metrics row per step (process 1 wrote none), one summary, one exported model.
    summary = json.loads((runs["resumed"] / "summary.json").read_text())
    assert summary["completed_steps"] == 3
    assert (runs["resumed"] / "model" / "config.json").exists()
    _, logs = runs["resumed_rc"]
    assert "steps done" in logs[0] and "steps done" not in logs[1]
