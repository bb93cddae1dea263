"""One colour per method in every figure: the palette, and the demo's, the study's, the
simulator's and a run's figures drawing a method in it whatever the order of their methods."""

import types

import matplotlib

matplotlib.use("Agg")
import matplotlib.colors  # noqa: E402
import matplotlib.container  # noqa: E402
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from gdro_jax import controllers, plots, sim, study  # noqa: E402

ORDERS = (("grpo", "gdro_both", "mopps"), ("mopps", "gdro_both", "grpo"))


def _hex(color) -> str:
    return matplotlib.colors.to_hex(color)


def test_every_method_has_its_own_colour_apart_from_the_others():
    assert set(plots.METHOD_COLORS) == set(controllers.METHODS)
    used = [*plots.METHOD_COLORS.values(), plots.BASELINE_COLOR, *plots.OTHER_COLORS]
    assert len({_hex(c) for c in used}) == len(used)


def test_a_label_keeps_its_colour_whatever_else_is_drawn():
    first = plots.colors_for(["gdro_both", "warm_start", "eta=0", "grpo"])
    second = plots.colors_for(["grpo", "eta=3", "gdro_both"])
    assert first["gdro_both"] == second["gdro_both"] == plots.METHOD_COLORS["gdro_both"]
    assert first["warm_start"] == plots.BASELINE_COLOR
    assert first["eta=0"] == second["eta=3"] == plots.OTHER_COLORS[0]  # not a method: the next
    assert first["eta=0"] not in plots.METHOD_COLORS.values()


def test_q_and_mu_are_shown_for_the_methods_that_have_them():
    assert [m for m in controllers.METHODS if plots.shows_q(m)] == ["prompt_gdro", "gdro_both"]
    assert [m for m in controllers.METHODS if plots.shows_mu(m)] == ["rollout_gdro", "gdro_both"]
    assert plots.shows_q("eta=3") and plots.shows_mu("signal")  # a sweep's labels: as given


def _line_colors(ax) -> dict[str, str]:
    return {line.get_label(): _hex(line.get_color()) for line in ax.get_lines()}


def test_the_run_the_study_and_the_simulator_figures_colour_a_method_alike():
    expected = {m: plots.METHOD_COLORS[m] for m in ORDERS[0]}
    for methods in ORDERS:
        steps = np.arange(1, 11)
        rows = {m: [{"step": int(s), "reward": 0.1 * s} for s in steps] for m in methods}
        curves = plots.plot_curves(rows, ("reward",))
        assert _line_colors(curves.axes[0]) == expected

        logs = {m: {"tokens": np.ones((2, 10)), "accuracy": np.full((2, 10), 0.5)} for m in methods}
        assert _line_colors(study.plot_tokens(logs, window=1).axes[0]) == expected

        trace = types.SimpleNamespace(
            **{
                name: np.zeros((2, 10))
                for name in ("mu", "lead_lag_gap", "informative_fraction", "mean_reward")
            },
            success_prob=np.zeros((2, 10, 3)),
            updated=np.ones((2, 10), bool),
        )
        outputs = {m: types.SimpleNamespace(trace=trace) for m in methods}
        signals = sim.plot_controller_signals(outputs)
        assert _line_colors(signals.axes[3]) == expected  # the reward panel: every method
        plt.close(signals)

        interval = sim.Interval(np.full(8, 0.5), np.full(8, 0.4), np.full(8, 0.6))
        bars = sim.plot_final_by_level({"pass@8": {m: interval for m in methods}}, "pass@8")
        drawn = {
            c.get_label(): _hex(c.patches[0].get_facecolor())
            for c in bars.axes[0].containers
            if isinstance(c, matplotlib.container.BarContainer)
        }
        assert drawn == expected
        plt.close(bars)
