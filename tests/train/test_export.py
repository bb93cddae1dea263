"""A finished run: its summary lines, and its checkpoint as a policy (`checkpoint.restore_policy`,
`eval.load_policy`)."""

import os
import pathlib
import re
import shutil

import jax
import numpy as np
import pytest
from flax import nnx

from gdro_jax import checkpoint, models, tasks, train
from gdro_jax import eval as evaluation
from tests.train.configs import small_run_config

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _assert_describes(result, workdir):
    """`describe_outputs`: the steps, the last step's reward and accuracy, every output's path."""
    text = train.describe_outputs(result, workdir)
    last = train.read_metrics(workdir / "metrics.jsonl")[-1]
    first, *paths = text.splitlines()
    assert first == (
        f"grpo: 2 of 2 steps done; last step: reward {last['reward']:.3f}, "
        f"accuracy {last['accuracy']:.3f}"
    )
    named = {line.split(": ")[0].strip() for line in paths}
    outputs = {"metrics.jsonl", "checkpoints", "model", "summary.json"}  # no tb/: tensorboard off
    outputs.add("plots")  # drawn on demand: the line gives the command
    assert named == {os.path.join(workdir, name) for name in outputs}
    assert paths[-1].endswith(f"python -m experiments.plot_run --workdir={workdir} draws them")


def test_the_summary_gives_the_tensorboard_command_whole_with_its_extra(tmp_path):
    workdir = tmp_path / "my run"  # a space: the commands quote it
    (workdir / "tb").mkdir(parents=True)
    result = {"method": "grpo", "completed_steps": 1, "steps": 1, "final": {}}
    lines = train.describe_outputs(result, workdir).splitlines()
    extra = re.search(r"^(\w+) = \[\"tensorboard", (ROOT / "pyproject.toml").read_text(), re.M)[1]
    assert lines[1] == (
        f"  {workdir}/tb: TensorBoard events: tensorboard --logdir '{workdir}/tb' "
        f"(the {extra} extra: pip install -e '.[{extra}]')"
    )
    assert lines[2] == (
        f"  {workdir}/plots: figures of reward, accuracy and the curriculum: "
        f"python -m experiments.plot_run '--workdir={workdir}' draws them"
    )


def test_the_newest_checkpoint_gives_the_final_policy_and_reads_only(tmp_path):
    config = small_run_config(steps=2, **{"checkpoint.every_steps": 1})
    workdir = tmp_path / "run"
    result = train.train(config, workdir)
    _assert_describes(result, workdir)
    shutil.rmtree(workdir / "model")  # only the checkpoints remain
    listing = sorted(p.relative_to(workdir) for p in workdir.rglob("*"))

    policy = evaluation.open_policy(workdir)
    model, tokenizer = policy.model, policy.tokenizer
    final = nnx.state(nnx.merge(result["run"].program.graphdef, result["state"].params), nnx.Param)
    for a, b in zip(
        jax.tree.leaves(nnx.state(model, nnx.Param)), jax.tree.leaves(final), strict=True
    ):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    ids = tokenizer.encode("1+2", add_special_tokens=False)
    assert tokenizer.decode(ids).replace(" ", "") == "1+2"
    assert len(tokenizer) == tasks.VOCAB_SIZE
    assert sorted(p.relative_to(workdir) for p in workdir.rglob("*")) == listing

    empty = tmp_path / "empty"
    (empty / "checkpoints").mkdir(parents=True)
    with pytest.raises(FileNotFoundError, match="holds no checkpoint"):
        checkpoint.restore_policy(empty)


def test_a_relative_workdir_checkpoints_and_resumes(tmp_path, monkeypatch):
    # `make demo` passes runs/demo: orbax wants absolute paths, the trainer must not care.
    monkeypatch.chdir(tmp_path)
    # Snapshots after steps 1 and 2 (evaluation along the run): the policy of that step, kept
    # when the run is extended.
    config = small_run_config(
        steps=1, **{"checkpoint.every_steps": 1, "checkpoint.snapshot_steps": (1, 2)}
    )
    first = train.train(config, "runs/relative")
    assert (tmp_path / "runs/relative/checkpoints/1").is_dir()
    config.steps = 2
    second = train.train(config, "runs/relative")
    assert second["completed_steps"] == 2 and first["completed_steps"] == 1
    for step, result in ((1, first), (2, second)):
        snapshot = models.from_pretrained(train.snapshot_path("runs/relative", step))
        trained = nnx.merge(result["run"].program.graphdef, result["state"].params)
        saved, want = nnx.state(snapshot, nnx.Param), nnx.state(trained, nnx.Param)
        for a, b in zip(jax.tree.leaves(saved), jax.tree.leaves(want), strict=True):
            np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert sorted(os.listdir("runs/relative/snapshots")) == ["step_1", "step_2"]
