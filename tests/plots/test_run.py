"""One run's figures (`plots.plot_run`) from a `metrics.jsonl` the trainer's own writer wrote:
the files a method has, valid PNGs of the figures with its panels, and the numbers drawn."""

import json

import matplotlib.colors
import numpy as np
import pytest
from PIL import Image

from experiments.configs import tiny_cpu
from gdro_jax import plots, train

STEPS, BINS = 12, 4
# Which methods have Prompt-GDRO's q and Rollout-GDRO's shadow price (README's method table).
WITH_Q = {"prompt_gdro", "gdro_both"}
WITH_MU = {"rollout_gdro", "gdro_both"}
METHODS = ("grpo", "prompt_gdro", "rollout_gdro", "gdro_both", "knapsack")


def _metrics(seed: int = 0) -> list[dict]:
    """Step metrics shaped as the step returns them (device scalars and per-bin arrays)."""
    rng = np.random.default_rng(seed)
    steps = []
    for step in range(STEPS):
        prompts = rng.integers(0, 4, BINS).astype(np.float32)
        prompts[step % BINS] = 0.0  # a bin absent from the batch every step
        q = rng.dirichlet(np.ones(BINS)).astype(np.float32)
        steps.append(
            {
                "reward": np.float32(np.nan if step == 5 else rng.uniform(-1, 1)),
                "accuracy": np.float32(rng.uniform()),
                "mu": np.float32(0.1 * step),
                "bin/prompts": prompts,
                "bin/q": q,
                "bin/rollouts_per_prompt": np.where(prompts > 0, rng.integers(1, 9, BINS), 0.0),
            }
        )
    return steps


def _write_run(workdir, method: str, seed: int = 0) -> list[dict]:
    """A run's folder as `train` leaves it: config.json and metrics.jsonl (the real writer)."""
    config = tiny_cpu.get_config()
    config.method = method
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "config.json").write_text(config.to_json_best_effort(indent=2))
    metrics = _metrics(seed)
    with train.MetricsWriter(workdir, tensorboard=False, append=False) as writer:
        for step, row in enumerate(metrics, start=1):
            writer.write(step, row)
    return metrics


@pytest.mark.parametrize("method", METHODS)
def test_a_run_gets_the_figures_of_its_method_as_valid_pngs(tmp_path, method):
    _write_run(tmp_path, method)
    paths = plots.plot_run(tmp_path, dpi=50)
    expected = ["training.png", "curriculum.png"] + (["shadow_price.png"] * (method in WITH_MU))
    assert [p.name for p in paths] == expected
    assert sorted(p.name for p in (tmp_path / "plots").iterdir()) == sorted(expected)
    rows = train.read_metrics(tmp_path / "metrics.jsonl")
    assert len(rows) == STEPS and rows[5]["reward"] == "nan"  # the writer's NaN, read back
    figures = {
        "training.png": plots.plot_curves({method: rows}),
        "curriculum.png": plots.plot_curriculum({method: rows}),
    }
    if method in WITH_MU:
        figures["shadow_price.png"] = plots.plot_shadow_price({method: rows})
    for path in paths:
        with Image.open(path) as image:
            image.verify()  # a whole, valid PNG
        with Image.open(path) as image:
            assert image.format == "PNG"
            # The PNG is the figure drawn: its size is the figure's at 50 dpi (one row of the
            # curriculum more with q: 110 px taller).
            width, height = figures[path.name].get_size_inches() * 50
            assert image.size == (round(width), round(height)), path.name


@pytest.mark.parametrize("method", ["grpo", "gdro_both"])
def test_the_curriculum_shows_the_batch_q_for_an_adversary_and_the_rollouts(tmp_path, method):
    metrics = _write_run(tmp_path, method)
    fig = plots.plot_curriculum({method: train.read_metrics(tmp_path / "metrics.jsonl")})
    heatmaps = [ax for ax in fig.axes if ax.images]  # one column: every panel is a heatmap
    prompts_TB = np.stack([m["bin/prompts"] for m in metrics])
    expected = [prompts_TB / prompts_TB.sum(axis=1, keepdims=True)]
    titles = ["share of the batch's\nprompts in the bin"]
    if method in WITH_Q:
        expected.append(np.stack([m["bin/q"] for m in metrics]))
        titles.append("Prompt-GDRO's q(bin)")
    rollouts_TB = np.stack([m["bin/rollouts_per_prompt"] for m in metrics])
    expected.append(np.where(prompts_TB > 0, rollouts_TB, np.nan))  # blank where no prompts
    titles.append("rollouts per prompt\nin the bin")
    assert len(heatmaps) == len(expected)
    for ax, values_TB in zip(heatmaps, expected, strict=True):
        drawn = np.ma.filled(ax.images[0].get_array().astype(np.float64), np.nan)
        np.testing.assert_allclose(drawn, values_TB.T, rtol=1e-6, atol=0, equal_nan=True)
        assert ax.get_ylabel() == "bin (0 hardest)"
    # A colour bar a row (the axes after the panels), labelled with what the row shows; the
    # column headed by the method in its colour.
    bars = [ax.get_ylabel() for ax in fig.axes[len(heatmaps) :]]
    assert bars == titles
    header = heatmaps[0].title
    assert header.get_text() == method
    assert matplotlib.colors.to_hex(header.get_color()) == plots.METHOD_COLORS[method]


def test_the_demo_layout_blanks_q_for_a_method_without_a_prompt_adversary(tmp_path):
    runs = {}
    for seed, method in enumerate(("grpo", "prompt_gdro")):
        _write_run(tmp_path / method, method, seed)
        runs[method] = train.read_metrics(tmp_path / method / "metrics.jsonl")
    fig = plots.plot_curriculum(runs)
    # The panels row by row (share, q, rollouts; a column per run), then a colour bar a row.
    panels, bars = fig.axes[:6], fig.axes[6:]
    assert [bool(ax.images) for ax in panels] == [True, True, False, True, True, True]
    assert "no prompt adversary" in panels[2].texts[0].get_text()
    assert [ax.get_ylabel().split("\n")[0] for ax in bars] == [
        "share of the batch's",
        "Prompt-GDRO's q(bin)",
        "rollouts per prompt",
    ]


def test_the_moving_average_is_the_mean_of_the_last_steps_without_nans():
    values = np.array([1.0, np.nan, 3.0, 4.0, np.nan, np.nan, np.nan, 8.0])
    expected = []
    for t in range(len(values)):
        window = values[max(0, t - 2) : t + 1]
        finite = window[np.isfinite(window)]
        expected.append(finite.mean() if finite.size else np.nan)
    np.testing.assert_allclose(plots.moving_average(values, 3), expected, atol=1e-12)


def test_a_folder_without_metrics_is_named_and_nothing_is_written(tmp_path):
    with pytest.raises(FileNotFoundError, match="metrics.jsonl does not exist"):
        plots.plot_run(tmp_path)
    (tmp_path / "metrics.jsonl").write_text("")
    (tmp_path / "config.json").write_text(json.dumps({"method": "grpo"}))
    with pytest.raises(ValueError, match="holds no step yet"):
        plots.plot_run(tmp_path)
    assert not (tmp_path / "plots").exists()
