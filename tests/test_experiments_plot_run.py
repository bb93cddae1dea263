"""`python -m experiments.plot_run`: a real 2-step run's figures as valid PNGs (slow: it trains),
and a folder that is no run refused in one line before anything is written."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
from PIL import Image

ROOT = Path(__file__).resolve().parents[1]
# tiny_cpu cut to seconds a step (the trainer tests' small run).
SMALL = (
    "--config.steps=2",
    "--config.num_prompts=4",
    "--config.n_mean=2",
    "--config.max_new_tokens=8",
    "--config.task.pool_size=16",
    "--config.model.num_layers=1",
    "--config.checkpoint.enabled=false",
    "--config.progress=false",
)


def _run(*argv):
    return subprocess.run(
        [sys.executable, "-m", *argv],
        cwd=ROOT,
        env=dict(os.environ, JAX_PLATFORMS="cpu"),
        capture_output=True,
        text=True,
        timeout=900,
    )


def test_a_folder_without_a_run_is_one_line_and_gets_no_plots(tmp_path):
    completed = _run("experiments.plot_run", f"--workdir={tmp_path}")
    assert completed.returncode == 2, completed.stderr[-2000:]
    (line,) = completed.stderr.strip().splitlines()
    assert line.startswith(f"error: {tmp_path / 'metrics.jsonl'} does not exist")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
def test_a_two_step_run_is_drawn_from_the_command_its_summary_gives(tmp_path):
    workdir = tmp_path / "run"
    train = _run(
        "experiments.train",
        "--config=experiments/configs/tiny_cpu.py",
        f"--workdir={workdir}",
        "--config.method=gdro_both",
        *SMALL,
    )
    assert train.returncode == 0, train.stderr[-3000:]
    command = f"python -m experiments.plot_run --workdir={workdir}"
    (line,) = [line for line in train.stdout.splitlines() if line.endswith(f"{command} draws them")]
    assert line.strip().startswith(f"{workdir / 'plots'}: figures of reward, accuracy")

    plot = _run(*command.split()[2:])
    assert plot.returncode == 0, plot.stderr[-3000:]
    names = ["training.png", "curriculum.png", "shadow_price.png"]  # gdro_both has q and mu
    assert sorted(p.name for p in (workdir / "plots").iterdir()) == sorted(names)
    assert plot.stdout.splitlines()[0] == f"Wrote {workdir / 'plots'}/:"
    sizes = {}
    for name in names:
        with Image.open(workdir / "plots" / name) as image:
            image.verify()
        with Image.open(workdir / "plots" / name) as image:
            sizes[name] = image.size
    # 100 dpi: the curriculum's three rows (the batch's bins, q, rollouts) of 2.2 in and 0.5 in.
    assert sizes["curriculum.png"] == (640, 710)
    assert sizes["training.png"] == (920, 340)  # two panels: reward and accuracy
