"""The lines a finished run prints: steps, the last reward and accuracy, where outputs are."""

import os

from gdro_jax import train
from tests.train.configs import small_run_config


def test_describe_outputs_names_the_steps_the_numbers_and_every_output_folder(tmp_path):
    workdir = tmp_path / "run"
    result = train.train(small_run_config(steps=2, tensorboard=True), workdir)
    text = train.describe_outputs(result, workdir)
    last = train.read_metrics(workdir / "metrics.jsonl")[-1]
    first, *paths = text.splitlines()
    assert first == (
        f"grpo: 2 of 2 steps done; last step: reward {last['reward']:.3f}, "
        f"accuracy {last['accuracy']:.3f}"
    )
    named = {line.split(": ")[0].strip() for line in paths}
    expected = {"metrics.jsonl", "tb", "checkpoints", "model", "summary.json"}
    assert named == {os.path.join(workdir, name) for name in expected}
    assert all(os.path.exists(path) for path in named)
