"""The memory plan is of the function that runs: for every method, with the built-in engine and
with an external one, the planner's independently built `StepProgram` lowers to the same
StableHLO as the step `train.build_run` runs; and `build_run`'s memory check plans the run's own
program (a `dynamic_sampling` run's buffer, a `logprobs_from=engine` run's rescoring and TIS).
"""

import re

import jax
import numpy as np
import pytest

from gdro_jax import configs, controllers, planner, tasks, train
from gdro_jax.step import Rollouts
from tests.train.configs import small_run_config

# Array constants (the prompt pool the rollout closes over) are data, not the program.
_CONSTANT = re.compile(r"dense<[^>]*>")


def _program_text(lowered) -> str:
    return _CONSTANT.sub("dense<...>", lowered.as_text())


class ConstantEngine:
    """An external engine without a model: every slot samples one token, 3, then stops."""

    def __init__(self, max_new_tokens: int):
        self.max_new_tokens = max_new_tokens

    def generate(self, params, plan, prompt_tokens_NP, prompt_lengths_N, key):
        del params, key
        prompt_of_slot = np.asarray(plan.prompt_of_slot)
        num_slots, width = len(prompt_of_slot), prompt_tokens_NP.shape[1]
        tokens = np.zeros((num_slots, self.max_new_tokens), np.int32)
        tokens[:, 0] = 3
        logprobs = np.zeros((num_slots, self.max_new_tokens), np.float32)
        logprobs[:, 0] = -1.0
        return Rollouts(
            prompt_tokens=np.asarray(prompt_tokens_NP)[prompt_of_slot].reshape(num_slots, width),
            prompt_lengths=np.asarray(prompt_lengths_N)[prompt_of_slot],
            tokens=tokens,
            lengths=np.ones(num_slots, np.int32),
            logprobs=logprobs,
            rewards=np.zeros(num_slots, np.float32),
            correct=np.zeros(num_slots, bool),
            engine_logprobs=logprobs,
        )

    def sync_weights(self, params):
        del params


def _abstract(tree):
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), tree)


def _recording(function, calls):
    def record(*args):
        outputs = function(*args)
        calls.append((_abstract(args), _abstract(outputs)))
        return outputs

    return record


def _lowered_run(run):
    """The run's rollout and update, lowered on the arguments its first step called them with
    (`train.run_step`, recorded)."""
    rollout_calls, update_calls = [], []
    recorded = run._replace(
        rollout=_recording(run.rollout, rollout_calls),
        update=_recording(run.update, update_calls),
    )
    train.run_step(recorded, run.state, next(run.prompt_batches))
    (rollout_args, rollouts), (update_args, _) = rollout_calls[0], update_calls[0]
    if run.program.external_engine:
        rollout = run.program.rescore.lower(rollout_args[0], rollouts)
    else:
        rollout = run.rollout.lower(*rollout_args)
    update = run.program.update(update_args[0]).lower(*update_args)
    return rollout, update


# Every method and engine in the slow tier (`make test-slow`, which CI runs): each case compiles
# a whole step.
CASES = [
    pytest.param(method, engine, marks=pytest.mark.slow)
    for method in controllers.METHODS
    for engine in ("kv_cache", "external")
]


@pytest.mark.parametrize(("method", "engine"), CASES)
def test_the_planner_lowers_the_step_the_run_runs(method, engine):
    external = engine == "external"
    # The external engine's runs on a 2-device mesh: its samples are placed on the batch axes.
    config = small_run_config(method, **({"mesh.data": 2} if external else {}))
    run = train.build_run(
        config, rollout_engine=ConstantEngine(config.max_new_tokens) if external else None
    )
    try:
        run_rollout, run_update = _lowered_run(run)
        # The planner's own program, built from the settings as `memory_plan` builds it.
        program = configs.step_program(
            run.settings,
            run.mesh,
            prompt_width=run.task.prompt_tokens.shape[1],
            num_dataset_prompts=run.task.num_prompts,
            eos_ids=run.task.eos_ids,
            external_engine=external,
            prompt_features=tasks.prompt_features(run.task),
        )
        plan = planner.Planner(run.settings, run.mesh, task=run.task, program=program)
        plan_rollout = plan.lower_rollout()
        plan_update, _ = plan.lower_update()
    finally:
        run.close()
    assert _program_text(plan_rollout) == _program_text(run_rollout)
    assert _program_text(plan_update) == _program_text(run_update)


@pytest.mark.slow
def test_build_run_plans_the_program_it_runs(monkeypatch):
    planned = []
    check = planner.check_memory_plan

    def recording_check(settings, mesh, *, task=None, program=None):
        result = check(settings, mesh, task=task, program=program)
        planned.append((program, result))
        return result

    monkeypatch.setattr(planner, "check_memory_plan", recording_check)
    dynamic = small_run_config("dynamic_sampling", device_memory_gib=64)
    engine_logprobs = small_run_config(
        "grpo", device_memory_gib=64, **{"rollout.logprobs_from": "engine"}
    )
    for config, engine in ((dynamic, None), (engine_logprobs, ConstantEngine(8))):
        run = train.build_run(config, rollout_engine=engine)
        run.close()
        program, memory = planned[-1]
        assert program is run.program
        assert memory is not None and memory.fits and memory.update > 0
    dynamic_program, _ = planned[0]
    assert dynamic_program.decisions.group_filter is not None
    assert dynamic_program.abstract_state(run.state.params).gdro.filter is not None
    engine_program, memory = planned[1]
    assert engine_program.external_engine and engine_program.rollout.logprobs_from == "engine"
    assert memory.kv_cache == 0  # the engine's cache is its own


@pytest.mark.slow
def test_the_planner_without_a_run_builds_the_same_program_from_the_config():
    """`memory_plan(config)` (experiments.plan) lowers what `build_run` would run."""
    config = small_run_config("gdro_both")
    settings = configs.read_run_config(config)
    mesh = configs.run_mesh(settings)
    task = tasks.chain_task(settings.chain, reward_values=settings.reward_values)
    from_config = planner.Planner(settings, mesh)
    from_task = planner.Planner(settings, mesh, task=task)
    assert from_config.prompt_width == from_task.prompt_width
    assert _program_text(from_config.lower_update()[0]) == _program_text(
        from_task.lower_update()[0]
    )


def test_a_run_builds_its_controllers_once(monkeypatch):
    """The config is read once: its checks, build_run and the memory plan share one build."""
    built = []
    factory = controllers.passk_classifier

    def counting(*args, **kwargs):
        built.append(args)
        return factory(*args, **kwargs)

    monkeypatch.setattr(controllers, "passk_classifier", counting)
    config = small_run_config("gdro_both", device_memory_gib=64)
    run = train.build_run(config)
    run.close()
    assert len(built) == 1, built
    assert run.program.decisions is run.settings.decisions
