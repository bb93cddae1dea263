"""The trainer's rollout seam: a plugged-in `RolloutEngine` is what the steps sample from and is
synced after every update; the built-in engine's micro-batches change nothing; the
`config.rollout` block is validated, optional and changeable on resume."""

import math
import re
import sys

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest
from flax import nnx

from gdro_jax import configs, losses, tasks, train
from gdro_jax.step import KVCacheEngine, MissingExtraError, RolloutConfig, Rollouts
from tests.train.configs import small_run_config


class HalfOracle:
    """An engine without a model: the gold solution on even slots, a lone `<eos>` on odd ones.

    It records its calls and keeps a host copy of every set of weights it is sent, as an engine
    holding its own weights would.
    """

    def __init__(self, config):
        task_config = tasks.ChainTaskConfig(**config.task.to_dict())
        pool = tasks.encode_rows(tasks.build_splits(task_config).train, task_config)
        self.gold = {
            tuple(prompt[:length]): solution
            for prompt, length, solution in zip(
                pool.prompt_tokens, pool.prompt_lengths, pool.solution_tokens, strict=True
            )
        }
        self.max_new_tokens = config.max_new_tokens
        self.vocab = config.model.vocab_size
        self.generate_calls = 0
        self.synced = []

    def generate(self, params, plan, prompt_tokens_NP, prompt_lengths_N, key):
        del params, key
        self.generate_calls += 1
        prompts, lengths = np.asarray(prompt_tokens_NP), np.asarray(prompt_lengths_N)
        prompt_of_slot = np.asarray(plan.prompt_of_slot)
        R, (_, P), M = len(prompt_of_slot), prompts.shape, self.max_new_tokens
        left = np.full((R, P), tasks.PAD_ID, np.int32)
        tokens = np.full((R, M), tasks.PAD_ID, np.int32)
        completion_lengths = np.ones(R, np.int32)
        tokens[:, 0] = tasks.EOS_ID
        for r, p in enumerate(prompt_of_slot):
            left[r, P - lengths[p] :] = prompts[p, : lengths[p]]
            if r % 2 == 0:
                solution = self.gold[tuple(prompts[p, : lengths[p]])]
                completion_lengths[r] = int(np.argmax(solution == tasks.EOS_ID)) + 1
                tokens[r, : completion_lengths[r]] = solution[: completion_lengths[r]]
        within = np.arange(M)[None] < completion_lengths[:, None]
        logprobs = np.where(within, -np.log(self.vocab), 0.0).astype(np.float32)
        return Rollouts(
            prompt_tokens=left,
            prompt_lengths=lengths[prompt_of_slot].astype(np.int32),
            tokens=tokens,
            lengths=completion_lengths,
            logprobs=logprobs,
            rewards=np.zeros(R, np.float32),
            correct=np.zeros(R, bool),
            engine_logprobs=logprobs,
        )

    def sync_weights(self, params):
        self.synced.append(jax.tree.map(np.array, params))


def _assert_same_tree(a, b):
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


# Log-probs of the same tokens computed at another batch shape: XLA may order a reduction by the
# shape (and by the CPU's vector width), so a float32 log-softmax over the vocabulary of logits of
# magnitude <= ~10 moves by a few ulps of its terms: <= ~1e-6, seen 2.4e-7 (one ulp at -2.9) on an
# AVX-512 machine. A row's log-probs taken from another row, or another token, move by ~1e-1.
LOGPROB_ATOL = 1e-5
_LOGPROB_FIELDS = ("logprobs", "engine_logprobs")


def _assert_equal_up_to_rounding(got, want):
    """Tokens, lengths, prompts, rewards exactly equal; log-probs to LOGPROB_ATOL."""
    for name in got._fields:
        a, b = np.asarray(getattr(got, name)), np.asarray(getattr(want, name))
        if name in _LOGPROB_FIELDS:
            np.testing.assert_allclose(a, b, rtol=0, atol=LOGPROB_ATOL, err_msg=name)
        else:
            np.testing.assert_array_equal(a, b, err_msg=name)


def test_the_trainer_samples_and_syncs_through_a_plugged_in_engine():
    # 48 new tokens: room for the longest gold solution (8 levels).
    config = small_run_config("grpo", max_new_tokens=48)
    engine = HalfOracle(config)
    run = train.build_run(config, rollout_engine=engine)
    state = run.state
    for step in range(2):
        state, metrics, _ = train.run_step(run, state, next(run.prompt_batches))
        assert engine.generate_calls == step + 1
        # Half the slots carry the engine's gold solutions: a random policy earns ~0 by itself.
        assert float(metrics["accuracy"]) == 0.5
        assert float(metrics["nonzero_advantage_fraction"]) == 1.0
        # The update's new parameters were sent to the engine.
        _assert_same_tree(engine.synced[-1], state.params)
    # The initial weights before the first rollout, then the new ones after each update.
    assert len(engine.synced) == 3
    for before, after in zip(engine.synced[:-1], engine.synced[1:], strict=True):
        assert not all(map(np.array_equal, jax.tree.leaves(before), jax.tree.leaves(after)))


@pytest.mark.slow
@pytest.mark.parametrize("batching", ["continuous", "static"])
def test_micro_batches_change_no_rollout_of_the_trainer(batching):
    run = train.build_run(small_run_config("grpo"))  # R = 4 x 2 = 8 slots, all at once
    ids = jnp.asarray(next(run.prompt_batches), jnp.int32)
    plan = run.plan(run.state.gdro, ids, jax.random.key(1))
    key = jax.random.key(2)
    whole = run.rollout(run.state.params, plan, ids, key)
    chunked = KVCacheEngine(
        run.program.graphdef,
        max_new_tokens=run.config.max_new_tokens,
        temperature=run.config.grpo.temperature,
        eos_ids=run.task.eos_ids,
        micro_batch_slots=2,
        batching=batching,
    ).generate(
        run.state.params,
        plan,
        run.task.prompt_tokens[np.asarray(ids)],
        run.task.prompt_lengths[np.asarray(ids)],
        key,
    )
    _assert_equal_up_to_rounding(chunked, whole)


@pytest.mark.parametrize(
    "value, mesh_data, message",
    [
        (-1, 1, "config.rollout.micro_batch_slots must be None or an int >= 0"),
        (2.0, 1, "got micro_batch_slots=2.0"),
        (3, 2, r"multiple of the mesh's batch axes \(data x fsdp = 2\)"),
    ],
)
def test_the_rollout_block_is_validated(value, mesh_data, message):
    config = small_run_config("grpo", **{"mesh.data": mesh_data})
    config.rollout = ml_collections.ConfigDict(dict(micro_batch_slots=value))  # any type
    with pytest.raises(ValueError, match=message):
        configs.read_run_config(config)


def test_the_rollout_block_is_optional_and_resumable():
    config = small_run_config("grpo", **{"rollout.micro_batch_slots": 4})
    configs.read_run_config(config)
    old = small_run_config("grpo")
    del old["rollout"]  # a config, or a checkpoint's config, from before the field
    configs.read_run_config(old)
    assert configs.config_differences(configs.config_dict(old), config) == []
    assert configs.config_differences(configs.config_dict(config), small_run_config("grpo")) == []


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"rollout.engine": "sglang"}, "engine must be one of kv_cache, vllm, got engine='sglang'"),
        ({"rollout.logprobs_from": "both"}, "logprobs_from must be one of trainer, engine"),
        ({"rollout.tis_cap": 0.5}, "tis_cap must be >= 1"),
        ({"rollout.lane_halvings": -1}, "lane_halvings must be an int >= 0, got lane_halvings=-1"),
        (
            {"rollout.stop_check_every": 0},
            "stop_check_every must be an int >= 1, got stop_check_every=0",
        ),
        ({"rollout.greedy": True, "grpo.temperature": 0.7}, "set config.grpo.temperature=1.0"),
        ({"rollout.vllm.dtype": "int8"}, "config.rollout.vllm.dtype must be one of auto"),
        ({"rollout.vllm.max_num_seqs": 0}, "config.rollout.vllm.max_num_seqs must be a positive"),
    ],
)
def test_the_engine_fields_are_validated(overrides, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        configs.read_run_config(small_run_config("grpo", **overrides))


def test_a_rollout_flag_that_is_not_a_bool_is_refused():
    """ConfigDict keeps a bool field a bool; a RolloutConfig built by hand is checked itself."""
    with pytest.raises(ValueError, match="skip_dead_blocks must be True or False, got .*=1"):
        RolloutConfig(skip_dead_blocks=1)


def test_the_rollout_settings_reach_the_built_in_engine():
    """`config.rollout`'s decode settings, as the run's step builds its engine."""
    rollout = {
        "decode_window": 8, "lane_halvings": 2, "stop_check_every": 4, "skip_dead_blocks": False,
    }  # fmt: skip
    config = small_run_config("grpo", **{f"rollout.{k}": v for k, v in rollout.items()})
    settings = configs.read_run_config(config)
    program = configs.step_program(
        settings, None, prompt_width=8, num_dataset_prompts=16, eos_ids=(1,)
    )
    engine = program.kv_cache_engine()
    assert {name: getattr(engine, name) for name in rollout} == rollout


def test_logprobs_from_engine_is_refused_for_the_kv_cache_engine():
    with pytest.raises(ValueError, match="the kv_cache engine samples with the trainer's own"):
        train.build_run(small_run_config("grpo", **{"rollout.logprobs_from": "engine"}))


@pytest.mark.parametrize(
    "logprobs_from", [pytest.param("trainer", marks=pytest.mark.slow), "engine"]
)
def test_another_engines_tokens_are_weighted_by_the_truncated_ratio(logprobs_from):
    """One mini-batch, at the step's own parameters (ratio 1): the policy loss is
    -sum_t w_t A_i / tokens, with w_t = min(pi_trainer / pi_engine, C) under logprobs_from=engine
    (pi_engine: the oracle's uniform log-probs) and 1 under trainer."""
    cap = 1.0  # a random policy stays near the uniform pi_engine: ratios on both sides of 1
    config = small_run_config(
        "grpo",
        max_new_tokens=48,
        **{
            "grpo.num_minibatches": 1,
            "rollout.logprobs_from": logprobs_from,
            "rollout.tis_cap": cap,
        },
    )
    run = train.build_run(config, rollout_engine=HalfOracle(config))
    ids = jnp.asarray(next(run.prompt_batches), jnp.int32)
    plan = run.plan(run.state.gdro, ids, jax.random.key(1))
    rollouts = run.reward(ids, run.rollout(run.state.params, plan, ids, jax.random.key(2)), plan)
    trainer, engine = np.asarray(rollouts.logprobs), np.asarray(rollouts.engine_logprobs)
    advantages = np.asarray(
        losses.group_advantages(rollouts.rewards, plan.prompt_of_slot, config.num_prompts)
    )
    lengths = np.asarray(rollouts.lengths)
    total, tokens, capped = 0.0, 0, 0
    for r in range(len(lengths)):
        for t in range(lengths[r]):
            ratio = math.exp(float(trainer[r, t]) - float(engine[r, t]))
            weight = min(ratio, cap) if logprobs_from == "engine" else 1.0
            total += weight * float(advantages[r])
            tokens += 1
            capped += ratio > cap
    _, metrics = run.update(run.state, plan, ids, rollouts)
    assert 0 < capped < tokens  # the cap binds on some tokens only
    assert float(metrics["pg_loss"]) == pytest.approx(-total / tokens, rel=1e-5, abs=1e-7)
    assert float(metrics["rollout/is_weight_capped_fraction"]) == pytest.approx(capped / tokens)


def test_asking_for_vllm_without_the_extra_names_the_extra(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "vllm", None)  # as if not installed
    config = small_run_config("grpo", **{"rollout.engine": "vllm", "model.head_dim": 32})
    with pytest.raises(MissingExtraError, match=re.escape("pip install -e '.[vllm]'")):
        train.train(config, tmp_path / "run")
    assert not (tmp_path / "run").exists()


def test_greedy_kv_cache_rollouts_are_the_argmax_of_the_trainers_logits():
    """`rollout.greedy`: every token is the most likely one under the policy (checked against a
    full forward pass), and the log-probs are under temperature 1."""
    run = train.build_run(small_run_config("grpo", **{"rollout.greedy": True}))
    ids = jnp.asarray(next(run.prompt_batches), jnp.int32)
    plan = run.plan(run.state.gdro, ids, jax.random.key(1))
    rollouts = run.rollout(run.state.params, plan, ids, jax.random.key(2))
    model = nnx.merge(run.program.graphdef, run.state.params)
    prompts, lengths = np.asarray(rollouts.prompt_tokens), np.asarray(rollouts.prompt_lengths)
    tokens, completion = np.asarray(rollouts.tokens), np.asarray(rollouts.lengths)
    for r in range(tokens.shape[0]):
        sequence = np.concatenate([prompts[r, prompts.shape[1] - lengths[r] :], tokens[r]])
        positions = jnp.arange(len(sequence))[None]
        logits = np.asarray(model(jnp.asarray(sequence[None]), positions)[0], np.float64)
        for t in range(completion[r]):
            step_logits = logits[lengths[r] + t - 1]
            assert tokens[r, t] == np.argmax(step_logits), (r, t)
            top = step_logits.max()
            log_softmax = step_logits - top - np.log(np.sum(np.exp(step_logits - top)))
            assert rollouts.logprobs[r, t] == pytest.approx(log_softmax[tokens[r, t]], abs=1e-4)
