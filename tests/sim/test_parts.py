"""Which parts a simulator compiles and which a method applies: names, unions and refusals.

Nothing here compiles a simulation: building a `Simulator` only traces when it first runs.
"""

import inspect

import jax.numpy as jnp
import pytest

from experiments.configs import sim_default
from gdro_jax import controllers, sim

TINY = sim.SimConfig(steps=4, num_prompts=4, num_levels=3, pool_size=12, heldout_per_level=4)
RIVALS = ("knapsack", "vip", "mopps", "dynamic_sampling", "pilot_commit")


def test_every_method_is_simulated_and_the_default_methods_are_the_gdro_ones():
    assert sim.SIMULATED_METHODS == tuple(controllers.METHODS)
    assert sim.GDRO_METHODS == ("grpo", "prompt_gdro", "rollout_gdro", "gdro_both")
    assert inspect.signature(sim.simulate).parameters["methods"].default == sim.GDRO_METHODS


def test_the_flags_hold_one_field_per_decision_of_the_registry():
    assert sim.MethodFlags._fields == controllers.DECISIONS


# Each method's parts written out by hand, decision by decision (None: GRPO's own choice).
EXPECTED_PARTS = {
    "grpo": {},
    "prompt_gdro": {"prompt_adversary": "prompt_gdro"},
    "rollout_gdro": {"rollout_allocation": "rollout_gdro"},
    "gdro_both": {"prompt_adversary": "prompt_gdro", "rollout_allocation": "rollout_gdro"},
    "knapsack": {"rollout_allocation": "knapsack"},
    "vip": {"rollout_allocation": "vip"},
    "mopps": {"prompt_sampler": "mopps"},
    "dynamic_sampling": {"group_filter": "dynamic_sampling"},
    "pilot_commit": {"group_filter": "pilot_commit"},
}


@pytest.mark.parametrize("method", tuple(controllers.METHODS))
def test_a_methods_flags_name_its_own_parts_only(method):
    flags = sim.method_flags(method)
    decoded = {}
    for decision, value in flags._asdict().items():
        assert value.dtype == jnp.int32 and value.shape == (), decision
        if int(value):
            decoded[decision] = list(controllers.PARTS[decision])[int(value) - 1]
    assert decoded == EXPECTED_PARTS[method]
    assert {d: sim.part_index(d, p) for d, p in decoded.items()} == {
        d: int(v) for d, v in flags._asdict().items() if int(v)
    }


def test_a_part_registered_without_a_simulator_block_is_refused_by_name(monkeypatch):
    # A new allocation in the registry, and a method that applies it: the simulator has no
    # `SimConfig` block to build it from, so it names the part rather than run without it.
    monkeypatch.setitem(controllers.PARTS["rollout_allocation"], "uniform_plus", lambda: None)
    record = controllers.Method("plus", "a test method", rollout_allocation="uniform_plus")
    monkeypatch.setitem(controllers.METHODS, "plus", record)
    refusal = "does not model rollout_allocation='uniform_plus' .*no block 'uniform_plus'"
    with pytest.raises(ValueError, match=refusal):
        sim.method_flags("plus")
    with pytest.raises(ValueError, match=refusal):
        sim.method_parts(["grpo", "plus"])
    with pytest.raises(ValueError, match=refusal):
        sim.simulate(TINY, ["grpo", "plus"])
    # The parts already registered keep their flags.
    assert int(sim.method_flags("knapsack").rollout_allocation) == 2


def test_method_parts_is_the_union_of_the_methods_parts_and_the_gdro_parts():
    assert sim.method_parts(["grpo"]) == sim.GDRO_PARTS
    assert sim.method_parts(sim.GDRO_METHODS) == sim.GDRO_PARTS
    assert sim.method_parts(["dynamic_sampling", "grpo", "knapsack"]) == (
        "prompt_gdro",
        "rollout_gdro",
        "knapsack",
        "dynamic_sampling",
    )
    assert sim.method_parts(controllers.METHODS) == sim.ALL_PARTS


def test_a_simulator_holds_the_gdro_parts_whatever_it_is_given_and_refuses_unknown_ones():
    assert sim.make_simulator(TINY).parts == sim.GDRO_PARTS
    assert sim.make_simulator(TINY, parts=("mopps",)).parts == (*sim.GDRO_PARTS, "mopps")
    with pytest.raises(ValueError, match="parts must be names from .* got parts=\\('ppo',\\)"):
        sim.make_simulator(TINY, parts=("ppo",))


def test_hand_made_flags_are_refused_when_their_parts_are_missing_or_do_not_combine():
    simulator = sim.make_simulator(TINY, parts=sim.ALL_PARTS)
    keys = sim.seed_keys(1)

    def flags(**parts):
        return sim.MethodFlags(
            **{
                decision: jnp.asarray(sim.part_index(decision, parts.get(decision)), jnp.int32)
                for decision in controllers.DECISIONS
            }
        )

    # A decision holds one part: a value past the registry's parts names none.
    past = len(controllers.PARTS["rollout_allocation"]) + 1
    too_far = flags()._replace(rollout_allocation=jnp.asarray(past, jnp.int32))
    with pytest.raises(ValueError, match=f"flags.rollout_allocation must be 0 .* got .*={past}"):
        simulator.run(too_far, keys)
    with pytest.raises(ValueError, match="does not combine"):
        simulator.run(flags(group_filter="dynamic_sampling", prompt_adversary="prompt_gdro"), keys)
    default = sim.make_simulator(TINY)
    with pytest.raises(ValueError, match="flags applying \\['knapsack', 'prompt_gdro'\\]"):
        default.run(flags(rollout_allocation="knapsack", prompt_adversary="prompt_gdro"), keys)
    with pytest.raises(ValueError, match="method 'mopps' needs the part 'mopps'"):
        default.run(flags(prompt_sampler="mopps"), keys)


@pytest.mark.parametrize(
    "block, key",
    [
        ("knapsack", "n_mean"),
        ("mopps", "num_prompts"),
        ("dynamic_sampling", "num_groups"),
        ("pilot_commit", "reward_values"),
    ],
)
def test_a_rivals_arguments_set_by_the_simulator_are_rejected(block, key):
    with pytest.raises(ValueError, match=f"{block}.{key} is set by the simulator"):
        sim.SimConfig(**{block: {key: 3}})


@pytest.mark.parametrize(
    "block, value, field",
    [
        ("knapsack", dict(n_max=1), "knapsack.n_min and n_max"),
        ("mopps", dict(target=2.0), "mopps.target"),
        ("dynamic_sampling", dict(max_rounds=0), "dynamic_sampling.max_rounds"),
    ],
)
def test_a_bad_rival_block_is_named_when_its_part_is_compiled_in(block, value, field):
    config = sim.SimConfig(**{block: value})
    with pytest.raises(ValueError, match=field):
        sim.make_simulator(config, parts=(block,))
    # A GDRO simulator does not read the block, as a GDRO run of the trainer does not.
    assert sim.make_simulator(config).parts == sim.GDRO_PARTS


def test_the_experiment_configs_rival_blocks_are_the_trainers_defaults():
    # The trainer's config schema reads each part's defaults off its factory: so does this test.
    config = sim_default.get_config()
    factories = {name: f for parts in controllers.PARTS.values() for name, f in parts.items()}
    for block in RIVALS:
        defaults = {
            name: parameter.default
            for name, parameter in inspect.signature(factories[block]).parameters.items()
            if parameter.default is not inspect.Parameter.empty
            and name not in controllers.RUN_LEVEL_ARGUMENTS
        }
        assert config[block].to_dict() == defaults, block
