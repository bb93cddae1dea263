"""The trainer and the simulator make the same decisions: one composition, held to itself.

For every method of `controllers.METHODS` (and Prompt-GDRO's `resample` realisation and the
released code's `bins_from="previous_batch"`), the trainer's composition (`configs.
build_controllers` from a run config: one part per decision) and the simulator's (`make_simulator`
over every part, each an alternative of its decision, chosen by the method's flags) are driven
through the same steps: the same states, the same batch ids and keys, the same outcomes (drawn
here from fixed success rates per prompt). Every plan, every group filter's round and every state
the method's parts reach must be equal, bit for bit.

What the simulator does not apply still runs (every part observes every step), so only the
applied parts' states are compared; the classifier's always is.
"""

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from gdro_jax import configs, controllers, sim
from tests._xla import DEFAULT_EMITTERS

NUM_PROMPTS, N_MEAN, POOL = 8, 4, 32
STEPS = 6
CLASSIFIER = {"window": 4, "k": 4}
# Knapsack-RL with a short history, so that it allocates within a few visits.
KNAPSACK = {"history": 4, "min_history": 1, "window": 4}


def _sim_config(classifier=None, prompt_gdro=None) -> sim.SimConfig:
    return sim.SimConfig(
        steps=STEPS,
        num_prompts=NUM_PROMPTS,
        n_mean=N_MEAN,
        num_levels=3,
        pool_size=POOL,
        heldout_per_level=4,
        classifier={**CLASSIFIER, **(classifier or {})},
        prompt_gdro=prompt_gdro or {},
        knapsack=KNAPSACK,
    )


def _trainer(method: str, sim_config: sim.SimConfig) -> controllers.MultiAdversary:
    """The trainer's composition of `method`, from a run config holding the simulator's blocks,
    over the simulator's features of its pool's prompts (each prompt's level / L)."""
    config = configs.run_config()
    config.method = method
    config.num_prompts = NUM_PROMPTS
    config.n_mean = N_MEAN
    config.reward_values = (sim_config.reward_wrong, sim_config.reward_correct)
    for block in ("classifier", "prompt_gdro", "rollout_gdro", "knapsack", "vip", "mopps"):
        config[block].update(ml_collections.ConfigDict(dict(getattr(sim_config, block))))
    levels = sim.prompt_levels(sim_config.pool_counts)
    return configs.build_controllers(config, POOL, levels[:, None] / sim_config.num_levels)


CASES = {
    **{method: (method, {}, {}) for method in controllers.METHODS},
    "prompt_gdro_resample": ("prompt_gdro", {}, {"realisation": "resample"}),
    "gdro_both_previous_batch": ("gdro_both", {"bins_from": "previous_batch"}, {}),
}


@pytest.fixture(scope="module")
def simulators():
    """One simulator over every part (every method), and one of the GDRO parts for each
    variant a prompt sampler does not combine with; each jitted once for all its methods."""
    built = {}
    for _, classifier, prompt_gdro in CASES.values():
        variant = (tuple(classifier.items()), tuple(prompt_gdro.items()))
        if variant not in built:
            parts = sim.ALL_PARTS if variant == ((), ()) else sim.GDRO_PARTS
            simulator = sim.make_simulator(_sim_config(classifier, prompt_gdro), parts=parts)
            decisions = simulator.decisions
            built[variant] = (
                simulator,
                jax.jit(decisions.plan, compiler_options=DEFAULT_EMITTERS),
                jax.jit(decisions.filter, compiler_options=DEFAULT_EMITTERS),
                jax.jit(decisions.update, compiler_options=DEFAULT_EMITTERS),
            )
    return {
        case: built[(tuple(classifier.items()), tuple(prompt_gdro.items()))]
        for case, (_, classifier, prompt_gdro) in CASES.items()
    }


def _equal(name: str, trainer, simulator) -> None:
    leaves_t, tree_t = jax.tree.flatten(trainer)
    leaves_s, tree_s = jax.tree.flatten(simulator)
    assert tree_t == tree_s, name
    for leaf_t, leaf_s in zip(leaves_t, leaves_s, strict=True):
        np.testing.assert_array_equal(np.asarray(leaf_t), np.asarray(leaf_s), err_msg=name)


def _groups(success_NG: np.ndarray, ids_N: jax.Array) -> dict:
    return {"success": jnp.asarray(success_NG), "prompt": ids_N}


@pytest.mark.parametrize("case", tuple(CASES))
def test_the_trainer_and_the_simulator_make_the_same_decisions(case, simulators):
    method, classifier, prompt_gdro = CASES[case]
    simulator, sim_plan, sim_filter, sim_update = simulators[case]
    trainer = _trainer(method, simulator.config)
    trainer_plan = jax.jit(trainer.plan, compiler_options=DEFAULT_EMITTERS)
    trainer_filter = jax.jit(trainer.filter, compiler_options=DEFAULT_EMITTERS)
    trainer_update = jax.jit(trainer.update, compiler_options=DEFAULT_EMITTERS)
    applied = simulator.applied(sim.method_flags(method, simulator.parts))
    parts = controllers.get_method(method).parts()  # {decision: part} the method applies
    assert {part for part, on in applied.items() if bool(on)} == set(parts.values())

    rng = np.random.default_rng(7)
    true_rate_D = rng.uniform(0.0, 1.0, POOL)
    true_rate_D[:6] = [0.0, 0.0, 1.0, 1.0, 0.0, 1.0]  # groups without a signal for the filter
    example = _groups(np.zeros((NUM_PROMPTS, N_MEAN), bool), jnp.zeros(NUM_PROMPTS, jnp.int32))
    state_t, state_s = trainer.init(example), simulator.decisions.init(example)
    fields = {
        "prompt_adversary": "prompt",
        "rollout_allocation": "rollout",
        "prompt_sampler": "sampler",
        "group_filter": "filter",
    }
    keys = jax.random.split(jax.random.key(3), STEPS)
    for step in range(STEPS):
        ids = jnp.asarray(rng.permutation(POOL)[:NUM_PROMPTS], jnp.int32)
        draw_key, allocate_key = jax.random.split(keys[step])
        plan_keys = controllers.PlanKeys(draw=draw_key, allocate=allocate_key)
        plan_t = trainer_plan(state_t, ids, plan_keys)
        plan_s = sim_plan(state_s, ids, plan_keys, applied=applied)
        for field in ("bins", "p_hat", "num_rollouts", "prompt_of_slot", "advantage_weights",
                      "mu", "prompt_ids", "importance", "estimate"):  # fmt: skip
            if getattr(plan_t, field) is not None:
                _equal(f"step {step} plan.{field}", getattr(plan_t, field), getattr(plan_s, field))
        for decision, part in parts.items():
            if decision != "group_filter":
                _equal(f"step {step} {part}'s report", plan_t.reports[decision],
                       plan_s.reports[part])  # fmt: skip

        # The outcomes of the planned rollouts, the same for both.
        batch = np.asarray(plan_t.prompt_ids)
        counts = np.asarray(plan_t.num_rollouts)
        success_NG = rng.uniform(size=(NUM_PROMPTS, counts.max())) < true_rate_D[batch, None]
        success_NG &= np.arange(counts.max())[None, :] < counts[:, None]
        num_correct = jnp.asarray(success_NG.sum(axis=1), jnp.int32)
        losses = jnp.asarray(1.0 - success_NG.sum(axis=1) / counts, jnp.float32)
        if "group_filter" in parts:  # N groups of n_mean rollouts: the filter's round
            groups = _groups(success_NG, plan_t.prompt_ids)
            rewards = jnp.where(groups["success"], 1.0, -1.0)
            _equal(f"step {step} selection", plan_t.selections["group_filter"],
                   plan_s.selections[parts["group_filter"]])  # fmt: skip
            state_t, filtered_t = trainer_filter(state_t, groups, rewards, plan=plan_t)
            state_s, filtered_s = sim_filter(state_s, groups, rewards, plan=plan_s,
                                             applied=applied)  # fmt: skip
            for field in ("active", "ready", "groups", "filled", "group_of_row"):
                _equal(f"step {step} filtered.{field}", getattr(filtered_t, field),
                       getattr(filtered_s, field))  # fmt: skip
            _equal(f"step {step} filter report", filtered_t.reports["group_filter"],
                   filtered_s.reports[parts["group_filter"]])  # fmt: skip
        observed = dict(num_correct=num_correct, losses=losses)
        state_t = trainer_update(state_t, plan_t, plan_t.prompt_ids, **observed)
        state_s = sim_update(state_s, plan_s, plan_s.prompt_ids, **observed)

        _equal(f"step {step} classifier", state_t.classifier, state_s.classifier)
        _equal(f"step {step} previous_bins", state_t.previous_bins, state_s.previous_bins)
        for decision, part in parts.items():
            field = fields[decision]
            _equal(f"step {step} {part}", getattr(state_t, field), getattr(state_s, field)[part])
    # The run made decisions worth comparing: rollouts moved, weights or batches changed.
    if "rollout_allocation" in parts:
        assert len(set(np.asarray(plan_t.num_rollouts).tolist())) > 1
    if "prompt_adversary" in parts and classifier == {} and prompt_gdro == {}:
        assert np.ptp(np.asarray(plan_t.advantage_weights)) > 0


def test_the_simulator_refuses_a_prompt_sampler_beside_a_resampling_adversary():
    config = _sim_config(prompt_gdro={"realisation": "resample"})
    with pytest.raises(ValueError, match="prompt sampler draws the batch itself"):
        sim.make_simulator(config, parts=("mopps",))
