"""Adding a part is one definition and one registry line: a toy rollout allocation, defined here
and registered in `controllers.PARTS` with a method naming it in `controllers.METHODS`, gets its
config block, trains two steps through `build_run` and has its memory plan."""

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from gdro_jax import configs, controllers, planner, train
from tests.train.configs import small_run_config


class TiltState(NamedTuple):
    step: jax.Array  # [] int32 updates applied


class Tilt(NamedTuple):
    init: object
    allocate: object
    update: object
    metrics: object
    n_mean: int
    num_bins: None = None  # by prompt


def tilted_allocation(n_mean: int = 4, shift: int = 1) -> Tilt:
    """A toy allocation: the first prompt takes `shift` rollouts from the last.

    Args:
      n_mean: rollouts per prompt on average.
      shift: rollouts moved from the batch's last prompt to its first.
    """
    if not 0 <= shift < n_mean:
        raise ValueError(f"shift must be in [0, n_mean), got shift={shift!r}")

    def init():
        return TiltState(step=jnp.zeros((), jnp.int32))

    def allocate(state, bins, p_hat=None, key=None, *, prompt_ids):
        del state, bins, p_hat, key
        counts = jnp.full(jnp.shape(prompt_ids), n_mean, jnp.int32)
        counts = counts.at[0].add(shift).at[-1].add(-shift)
        return counts, controllers.KnapsackInfo(
            success_rate=None, effective=None, fallback=None, mu=jnp.zeros((), jnp.float32)
        )

    def update(state, bins, **observations):
        del bins, observations
        return state._replace(step=state.step + 1)

    def metrics(info):  # what the step logs of it: its price, none here
        return {"mu": info.mu}

    return Tilt(init=init, allocate=allocate, update=update, metrics=metrics, n_mean=n_mean)


@pytest.fixture
def registered(monkeypatch):
    monkeypatch.setitem(
        controllers.PARTS["rollout_allocation"], "tilted_allocation", tilted_allocation
    )
    monkeypatch.setitem(
        controllers.METHODS,
        "tilt",
        controllers.Method("tilt", "a toy allocation", rollout_allocation="tilted_allocation"),
    )


@pytest.mark.slow
def test_a_part_registered_in_one_line_trains_and_is_planned(registered):
    assert isinstance(tilted_allocation(), controllers.RolloutAllocator)
    # The run schema reads the factory: its block and field exist with their defaults.
    assert configs.run_schema()["tilted_allocation"]["shift"].default == 1
    config = small_run_config("tilt", n_mean=4, **{"tilted_allocation.shift": 2})
    run = train.build_run(config)
    plans = []
    recorded = run._replace(plan=lambda *args: plans.append(run.plan(*args)) or plans[-1])
    state = run.state
    try:
        for _ in range(2):
            state, metrics, _ = train.run_step(recorded, state, next(run.prompt_batches))
            assert np.isfinite(float(metrics["loss"]))
    finally:
        run.close()
    n_mean, num_prompts = config.n_mean, config.num_prompts
    expected = [n_mean + 2] + [n_mean] * (num_prompts - 2) + [n_mean - 2]
    for plan in plans:
        assert np.asarray(plan.num_rollouts).tolist() == expected
    assert int(state.gdro.rollout.step) == 2  # the part's update ran once a step
    memory = planner.memory_plan(config, run.mesh)
    assert memory.update > 0 and memory.rollout_other > 0


def test_a_registered_part_refuses_its_bad_field_by_name(registered):
    config = small_run_config("tilt", **{"tilted_allocation.shift": 9})
    with pytest.raises(ValueError, match=r"config\.tilted_allocation\.shift must be in"):
        configs.read_run_config(config)
