"""vLLM behind the `RolloutEngine` seam, on CPU (`make test-vllm`, the vllm extra).

The built-in KV-cache engine is the reference: greedy decoding of the same weights in float32
gives the same tokens, so after an update vLLM's greedy rollouts equal the KV-cache engine's only
when the new weights reached vLLM. The planted bugs each test was seen failing on are named in
its docstring.
"""

import json

import jax
import numpy as np
import pytest

from gdro_jax import train
from gdro_jax.step import KVCacheEngine, VLLMEngine
from tests.train.configs import small_run_config

# Deselected by `make test`; without the extra, building an engine says which to install.
pytestmark = pytest.mark.vllm

# vLLM's CPU attention takes head widths of 32 and more; eager mode starts in seconds.
VLLM = {"model.head_dim": 32, "rollout.engine": "vllm", "rollout.vllm.enforce_eager": True}
MISMATCH = {
    "rollout/logprob_mismatch_mean",
    "rollout/logprob_mismatch_max",
    "rollout/is_weight_capped_fraction",
}


def _kv_rollouts(run, params, plan, ids, key, greedy):
    ids = np.asarray(ids)
    engine = KVCacheEngine(
        run.program.graphdef,
        max_new_tokens=run.config.max_new_tokens,
        temperature=0.0 if greedy else run.config.grpo.temperature,
        eos_ids=run.task.eos_ids,
        micro_batch_slots=2,  # fewer decode slots than rollouts: the continuous batch's queue
    )
    return engine.generate(
        params, plan, run.task.prompt_tokens[ids], run.task.prompt_lengths[ids], key
    )


# One rollout per prompt: a group of one keeps its reward as its advantage, so greedy steps
# (identical rollouts within a group) still move the weights.
GREEDY = {"rollout.greedy": True, "n_mean": 1}


@pytest.fixture(scope="module")
def greedy_run():
    """A vLLM run after one update (weights synced), and the KV-cache engine's greedy rollouts
    under the initial and the updated weights."""
    run = train.build_run(small_run_config("grpo", **VLLM, **GREEDY))
    before = run.state.params
    ids = np.asarray(next(run.prompt_batches))
    plan = run.plan(run.state.gdro, ids, jax.random.key(1))
    key = jax.random.key(2)
    initial = _kv_rollouts(run, before, plan, ids, key, greedy=True)
    state, _, _ = train.run_step(run, run.state, next(run.prompt_batches))
    # A list, so that a test that steps the run leaves the next one live parameters (a step
    # donates the state it is given).
    yield [run, state, plan, ids, key, initial]
    run.close()


def test_greedy_rollouts_after_an_update_equal_the_kv_cache_engines(greedy_run):
    """Planted: `sync_weights` a no-op (vLLM keeps the initial weights): the tokens differ."""
    run, state, plan, ids, key, initial = greedy_run
    ours = _kv_rollouts(run, state.params, plan, ids, key, greedy=True)
    theirs = run.rollout(state.params, plan, ids, key)
    # The update changed the greedy completions: equal tokens below need the new weights.
    assert not np.array_equal(np.asarray(initial.tokens), np.asarray(ours.tokens))
    np.testing.assert_array_equal(np.asarray(theirs.tokens), np.asarray(ours.tokens))
    np.testing.assert_array_equal(np.asarray(theirs.lengths), np.asarray(ours.lengths))
    np.testing.assert_array_equal(np.asarray(theirs.prompt_tokens), np.asarray(ours.prompt_tokens))
    # log pi_old is the trainer's (recomputed); vLLM's own agree to float32 rounding.
    np.testing.assert_allclose(theirs.logprobs, ours.logprobs, atol=2e-5)
    np.testing.assert_allclose(theirs.engine_logprobs, ours.logprobs, atol=1e-4)


def test_the_mismatch_metrics_are_zero_for_the_same_weights_in_float32(greedy_run):
    run, state, _, _, _, _ = greedy_run
    greedy_run[1], metrics, _ = train.run_step(run, state, next(run.prompt_batches))
    assert float(metrics["rollout/logprob_mismatch_max"]) < 1e-4
    assert float(metrics["rollout/logprob_mismatch_mean"]) < 1e-5
    assert float(metrics["rollout/is_weight_capped_fraction"]) == 0.0


def test_each_slot_of_an_uneven_plan_is_one_request_of_its_prompt(greedy_run):
    """Rollout-GDRO's per-prompt counts reach vLLM. Planted: one request per prompt with
    `n_mean` completions (the plan's counts ignored): the counts differ."""
    run, state, plan, ids, key, _ = greedy_run
    engine = _engine_of(run)
    prompt_of_slot = np.array([0, 0, 0, 0, 0, 1, 2, 3], np.int32)  # 5, 1, 1, 1 slots
    uneven = plan._replace(
        prompt_of_slot=jax.numpy.asarray(prompt_of_slot),
        num_rollouts=jax.numpy.asarray([5, 1, 1, 1], np.int32),
    )
    rollouts = run.rollout(state.params, uneven, ids, key)
    prompts = run.task.prompt_tokens[ids]
    lengths = run.task.prompt_lengths[ids]
    sent = [tuple(request) for request in engine.requests_sent]
    for p in range(4):
        asked = tuple(prompts[p, : lengths[p]].tolist())
        assert sent.count(asked) == np.sum(prompt_of_slot == p), p
    left = np.asarray(rollouts.prompt_tokens)
    for r, p in enumerate(prompt_of_slot):
        prompt = prompts[p, : lengths[p]]
        np.testing.assert_array_equal(left[r, left.shape[1] - lengths[p] :], prompt)


def _engine_of(run):
    """The VLLMEngine behind a run's rollout function."""
    for cell in run.rollout.__closure__:
        target = getattr(cell.cell_contents, "engine", None)
        if isinstance(target, VLLMEngine):
            return target
    raise AssertionError("no VLLMEngine in the run")


def test_seeded_sampling_repeats_and_another_key_samples_otherwise(greedy_run):
    """Seeds from the step's key: the same key gives the same rollouts in another call (a
    resumed run). Planted: no seed passed to vLLM: the two calls differ."""
    run, state, plan, ids, _, _ = greedy_run
    engine = _engine_of(run)
    engine.temperature = 1.0  # sample (the run decodes greedily)
    try:
        prompts = run.task.prompt_tokens[np.asarray(ids)]
        lengths = run.task.prompt_lengths[np.asarray(ids)]
        first = engine.generate(state.params, plan, prompts, lengths, jax.random.key(7))
        again = engine.generate(state.params, plan, prompts, lengths, jax.random.key(7))
        other = engine.generate(state.params, plan, prompts, lengths, jax.random.key(8))
    finally:
        engine.temperature = 0.0
    np.testing.assert_array_equal(first.tokens, again.tokens)
    np.testing.assert_array_equal(first.engine_logprobs, again.engine_logprobs)
    assert not np.array_equal(first.tokens, other.tokens)
    # Slots of one prompt draw different completions: each request has its own seed.
    tokens = np.asarray(first.tokens)
    slots_of_0 = np.nonzero(np.asarray(plan.prompt_of_slot) == 0)[0]
    assert len({tuple(tokens[r]) for r in slots_of_0}) == len(slots_of_0)


def _metrics(workdir):
    rows = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
    return [
        {k: v for k, v in row.items() if not k.startswith("time") and "seconds" not in k}
        for row in rows
    ]


def _assert_same_row(kv, vllm, step):
    assert set(vllm) - set(kv) == MISMATCH, step
    for name, value in kv.items():
        floats = np.asarray(value).dtype.kind == "f"
        if floats:
            message = f"step {step}: {name}"
            np.testing.assert_allclose(vllm[name], value, rtol=2e-5, atol=1e-6, err_msg=message)
        else:
            assert vllm[name] == value, (step, name)


def test_a_greedy_training_run_logs_the_same_metrics_through_either_engine(tmp_path):
    """Three steps, one rollout per prompt (a group of one keeps its reward, so every step
    moves the weights): the same metrics.jsonl through vLLM as through the KV-cache engine."""
    overrides = {
        **GREEDY,
        "steps": 3,
        "model.head_dim": 32,
        "checkpoint.enabled": False,
    }
    train.train(small_run_config("grpo", **overrides), tmp_path / "kv")
    train.train(small_run_config("grpo", **{**overrides, **VLLM}), tmp_path / "vllm")
    kv, vllm = _metrics(tmp_path / "kv"), _metrics(tmp_path / "vllm")
    assert [row["step"] for row in kv] == [row["step"] for row in vllm] == [1, 2, 3]
    for step, (a, b) in enumerate(zip(kv, vllm, strict=True), start=1):
        _assert_same_row(a, b, step)
    assert len({row["grad_norm"] for row in kv}) == 3 and min(r["grad_norm"] for r in kv) > 0


def test_a_head_width_the_cpu_backend_cannot_serve_is_refused_before_anything_is_written(
    tmp_path,
):
    config = small_run_config("grpo", **{**VLLM, "model.head_dim": 16})
    with pytest.raises(ValueError, match=r"cannot serve head_dim=16: it takes 32, 64"):
        train.train(config, tmp_path / "run")
    assert not (tmp_path / "run").exists()
