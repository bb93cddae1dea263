"""The simulator's figures a user looks at first carry titles, axis labels and a legend."""

import types

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from gdro_jax import sim  # noqa: E402

METHODS = ("grpo", "gdro_both")


def test_final_pass_at_8_has_a_title_axis_labels_and_a_legend():
    columns = 6 + 2  # six levels, pooled, natural
    interval = sim.Interval(np.full(columns, 0.5), np.full(columns, 0.4), np.full(columns, 0.6))
    fig = sim.plot_final_by_level({"pass@8": {m: interval for m in METHODS}}, "pass@8")
    (ax,) = fig.axes
    assert "pass@8" in ax.get_title()
    assert ax.get_xlabel() and "pass@8" in ax.get_ylabel()
    assert [t.get_text() for t in ax.get_legend().get_texts()] == list(METHODS)
    plt.close(fig)


def test_controller_signals_label_every_panel_and_share_one_legend():
    seeds, steps = 2, 12
    trace = types.SimpleNamespace(
        **{
            name: np.linspace(0.0, 1.0, seeds * steps).reshape(seeds, steps)
            for name in ("mu", "lead_lag_gap", "informative_fraction", "mean_reward")
        },
        success_prob=np.full((seeds, steps, 4), 0.5),  # [S, T, N]
        updated=np.arange(seeds * steps).reshape(seeds, steps) % 2 == 0,
    )
    outputs = {m: types.SimpleNamespace(trace=trace) for m in METHODS}
    fig = sim.plot_controller_signals(outputs)
    assert len(fig.axes) == 6
    for ax in fig.axes:
        assert ax.get_title() and ax.get_xlabel() == "step" and ax.get_ylabel()
    (legend,) = fig.legends
    assert [t.get_text() for t in legend.get_texts()] == list(METHODS)
    # The optimizer steps are counted, not smoothed: every other step of 12 took one.
    steps_taken = fig.axes[5].get_lines()[0].get_ydata()
    assert steps_taken[-1] == steps / 2
    plt.close(fig)


def test_the_shadow_price_is_drawn_only_for_methods_that_have_one():
    seeds, steps = 2, 12
    trace = types.SimpleNamespace(
        **{name: np.ones((seeds, steps)) for name in ("mu", "lead_lag_gap", "mean_reward")},
        informative_fraction=np.ones((seeds, steps)),
        success_prob=np.full((seeds, steps, 4), 0.5),
        updated=np.ones((seeds, steps), bool),
    )
    # Every trace holds a mu (the simulator runs Rollout-GDRO for all); grpo and knapsack pay none.
    methods = ("grpo", "rollout_gdro", "knapsack", "gdro_both", "eta=3")
    fig = sim.plot_controller_signals({m: types.SimpleNamespace(trace=trace) for m in methods})
    mu_panel, reward_panel = fig.axes[0], fig.axes[3]
    assert [line.get_label() for line in mu_panel.get_lines()] == [
        "rollout_gdro",
        "gdro_both",
        "eta=3",  # not a method's name (a sweep's setting): drawn as given
    ]
    assert [line.get_label() for line in reward_panel.get_lines()] == list(methods)
    plt.close(fig)
    fig = sim.plot_controller_signals({"grpo": types.SimpleNamespace(trace=trace)})
    assert not fig.axes[0].get_lines()
    assert fig.axes[0].texts[0].get_text() == "no method here has one"
    plt.close(fig)
