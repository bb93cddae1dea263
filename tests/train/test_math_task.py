"""The math path end to end: 8 real DAPO-Math prompts, a tiny random Qwen3, the grader pool.

A tokenizer is trained in the test (no hub), the policy is random, and one RL step samples,
grades in worker processes and updates. A random policy earns nothing, so the reward path is
also checked with completions written to contain the gold answer, and the update with them.
"""

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from experiments.configs import paper_qwen3, paper_qwen3_1p7b, paper_qwen3_4b, paper_qwen3_8b
from gdro_jax import checkpoint, configs, data, models, train
from gdro_jax import eval as evaluation
from gdro_jax.data import encode_prompts
from gdro_jax.sampling import completion_logprobs
from gdro_jax.train import _loop

ROOT = Path(__file__).resolve().parents[2]
NUM_PROMPTS = 8
N_MEAN = 2


@pytest.fixture(scope="module")
def math_run(data_dir, tmp_path_factory):
    rows = data.load_preset("dapo_math_en", data_dir)
    texts = [row["prompt"] for row in rows[:300]] + [f"\\boxed{{{r['answer']}}}" for r in rows]
    folder = tmp_path_factory.mktemp("tokenizer")
    tokenizer = data.build_tokenizer(texts, vocab_size=512, path=folder)

    config = paper_qwen3_1p7b.get_config()
    config.update(
        progress=False,
        tensorboard=False,
        method="gdro_both",
        num_prompts=NUM_PROMPTS,
        n_mean=N_MEAN,
        max_new_tokens=16,
        tokenizer=str(folder),
    )
    config.math.update(
        data_dir=str(data_dir), limit=NUM_PROMPTS, max_prompt_tokens=4096, grader_workers=1
    )
    tiny = models.DecoderConfig.tiny(vocab_size=len(tokenizer), max_position_embeddings=4096)
    config.model = dataclasses.asdict(tiny)
    config.mesh.update(data=1, fsdp=1, tensor=1)
    config.rollout_gdro.update(n_min=1, n_max=4)
    run = train.build_run(config)
    yield run, tokenizer
    run.task.close()


def test_the_pool_holds_the_first_rows_with_their_chat_prompts(math_run, data_dir):
    run, tokenizer = math_run
    rows = data.load_preset("dapo_math_en", data_dir)[:NUM_PROMPTS]
    assert run.task.num_prompts == NUM_PROMPTS and run.task.skipped_prompts == 0
    assert [row["id"] for row in run.task.rows] == [row["id"] for row in rows]
    for i in (0, NUM_PROMPTS - 1):
        length = int(run.task.prompt_lengths[i])
        text = tokenizer.decode(run.task.prompt_tokens[i, :length].tolist())
        assert text.startswith("<|im_start|>user\n") and text.endswith("<|im_start|>assistant\n")
        assert rows[i]["problem"] in text and data.PROMPT_SUFFIX in text
        assert not run.task.prompt_tokens[i, length:].any()


def test_one_full_step_samples_grades_and_updates(math_run):
    run, _ = math_run
    state = jax.tree.map(jnp.copy, run.state)  # the update donates its input
    before = run.task.grader.stats.items
    ids = next(run.prompt_batches)
    state, metrics, times = train.run_step(run, state, ids)
    assert int(state.step) == 1
    assert run.task.grader.stats.items - before == NUM_PROMPTS * N_MEAN
    # A random policy never writes the gold answer: every rollout is graded wrong (-1).
    assert float(metrics["reward"]) == -1.0 and float(metrics["accuracy"]) == 0.0
    for name in ("loss", "reward", "grad_norm", "response_length"):
        assert np.isfinite(float(metrics[name])), name
    assert set(times) == {"plan", "rollout", "reward", "update"}
    assert all(np.isfinite(p).all() for p in jax.tree.leaves(state.params))


# In a child process: open a math run's checkpoint as `experiments.evaluate` does and report
# whether the trainer was imported and whether any process (a grader worker) was started: every
# `subprocess.Popen` is recorded, since a grader's workers may be gone again by the end.
_OPEN_MATH = r"""
import json, subprocess, sys

started = []
_start = subprocess.Popen.__init__


def recording(self, *args, **kwargs):
    started.append(str(args[0] if args else kwargs.get("args")))
    _start(self, *args, **kwargs)


subprocess.Popen.__init__ = recording
from gdro_jax import eval as evaluation

policy = evaluation.open_policy(sys.argv[1])
print(json.dumps({
    "task_kind": policy.task_kind, "step": policy.step, "started": started,
    "vocab": len(policy.tokenizer), "layers": policy.model.config.num_layers,
    "trainer_loaded": sorted(m for m in sys.modules if m.startswith("gdro_jax.train")),
}))
"""


@pytest.mark.slow
def test_a_math_checkpoint_opens_without_the_trainer_or_a_grader(math_run, tmp_path):
    """Evaluation reads the policy alone: building the run would start grader workers."""
    run, tokenizer = math_run
    workdir = tmp_path / "math_run"
    manager = checkpoint.checkpoint_manager(workdir / checkpoint.CHECKPOINT_DIR, keep=1)
    _loop._save(manager, run, run.state, 0)  # step 0, as `train` writes a checkpoint
    manager.close()
    process = subprocess.run(
        [sys.executable, "-c", _OPEN_MATH, str(workdir)],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert process.returncode == 0, process.stderr[-3000:]
    opened = json.loads(process.stdout.strip().splitlines()[-1])
    assert opened["task_kind"] == "math" and opened["step"] == 0
    assert opened["vocab"] == len(tokenizer) and opened["layers"] == run.policy.num_layers
    assert opened["trainer_loaded"] == [] and opened["started"] == []


def _completion_tokens(tokenizer, texts, width):
    tokens = np.zeros((len(texts), width), np.int32)
    lengths = np.zeros((len(texts),), np.int32)
    for i, text in enumerate(texts):
        ids = tokenizer.encode(text, add_special_tokens=False) + [tokenizer.eos_token_id]
        tokens[i, : len(ids)] = ids
        lengths[i] = len(ids)
    return jnp.asarray(tokens), jnp.asarray(lengths)


@pytest.mark.slow
def test_graded_rewards_follow_the_gold_answers_and_the_update_favours_the_correct(math_run):
    run, tokenizer = math_run
    state = jax.tree.map(jnp.copy, run.state)  # the update donates its input
    ids = jnp.arange(NUM_PROMPTS, dtype=jnp.int32)
    plan = run.plan(state.gdro, ids, jax.random.key(0))
    rollouts = run.rollout(state.params, plan, ids, jax.random.key(1))
    slot_prompt = np.asarray(plan.prompt_of_slot)
    golds = [run.task.rows[int(p)]["answer"] for p in slot_prompt]
    # Even slots answer correctly, odd slots give a wrong number; so each group is mixed.
    texts = [
        f"so the answer is \\boxed{{{gold if slot % 2 == 0 else str(int(gold) + 1)}}}"
        for slot, gold in enumerate(golds)
    ]
    tokens, lengths = _completion_tokens(tokenizer, texts, 64)
    rollouts = rollouts._replace(tokens=tokens, lengths=lengths, logprobs=jnp.zeros((16, 64)))
    scored = run.reward(ids, rollouts, plan)
    expected = np.where(np.arange(len(golds)) % 2 == 0, 1.0, -1.0)
    np.testing.assert_array_equal(np.asarray(scored.rewards), expected)
    np.testing.assert_array_equal(np.asarray(scored.correct), expected > 0)

    # Old log-probs of the crafted completions under the current policy (ratio 1 at the start).
    old = completion_logprobs(
        nnx.merge(run.program.graphdef, state.params),
        scored.prompt_tokens,
        scored.prompt_lengths,
        scored.tokens,
        scored.lengths,
    )
    scored = scored._replace(logprobs=old)
    params_before = jax.tree.map(np.asarray, state.params)
    new_state, metrics = run.update(state, plan, ids, scored)
    moved = max(
        float(np.abs(np.asarray(a) - b).max())
        for a, b in zip(
            jax.tree.leaves(new_state.params), jax.tree.leaves(params_before), strict=True
        )
    )
    assert moved > 0.0
    assert float(metrics["nonzero_advantage_fraction"]) == 1.0

    # The step's direction: the correct completions' log-probabilities rose relative to the
    # wrong ones' (each slot's total over its tokens; every group pairs a right and a wrong one).
    new = completion_logprobs(
        nnx.merge(run.program.graphdef, new_state.params),
        scored.prompt_tokens,
        scored.prompt_lengths,
        scored.tokens,
        scored.lengths,
    )
    gain_R = np.asarray(jnp.sum(new - old, axis=1), np.float64)
    correct_R = np.asarray(scored.correct)
    # At lr 1e-6 the gap is ~2e-3 nats; float32 rounding of a ~70-nat sum is ~1e-5.
    assert gain_R[correct_R].mean() - gain_R[~correct_R].mean() > 1e-4


def test_long_prompts_are_skipped_and_counted_or_raise():
    class Whitespace:
        def __call__(self, texts, add_special_tokens=False):
            return {"input_ids": [[1] * len(text.split()) for text in texts]}

    rows = [{"id": str(i), "prompt": " ".join(["w"] * n)} for i, n in enumerate([3, 9, 5])]
    tokens, lengths, kept, skipped = encode_prompts(Whitespace(), rows, 5)
    assert skipped == 1 and [row["id"] for row in kept] == ["0", "2"]
    assert tokens.shape == (2, 5) and lengths.tolist() == [3, 5]
    with pytest.raises(ValueError, match=r"row 1 \(id='1'\) has a prompt of 9 tokens"):
        encode_prompts(Whitespace(), rows, 5, on_long_prompt="raise")
    with pytest.raises(ValueError, match="on_long_prompt"):
        encode_prompts(Whitespace(), rows, 5, on_long_prompt="truncate")


@pytest.mark.parametrize(
    ("module", "d_model"),
    [(paper_qwen3_1p7b, 2048), (paper_qwen3_4b, 2560), (paper_qwen3_8b, 4096)],
)
def test_paper_configs_carry_the_papers_settings(module, d_model):
    config = module.get_config()
    assert config.model.d_model == d_model and config.task_kind == "math"
    assert (config.num_prompts, config.n_mean, config.steps) == (256, 4, 1000)
    assert config.optimizer.learning_rate == 1e-6 and config.max_new_tokens == 4096
    assert (config.grpo.eps_low, config.grpo.eps_high, config.grpo.kl_coef) == (0.2, 0.28, 0.001)
    paper_eval = evaluation.EvalSettings()  # experiments.evaluate's defaults are the paper's
    assert (paper_eval.num_samples, paper_eval.temperature) == (8, 0.6)
    assert (paper_eval.top_p, paper_eval.top_k) == (0.8, 20)
    assert config.prompt_gdro.eta == 0.65 and config.rollout_gdro.n_max == 12
    models.DecoderConfig(**config.model.to_dict())  # a valid architecture
    configs.read_run_config(dict(config.to_dict(), init_from="x"), num_devices=8)  # and run
    with pytest.raises(ValueError, match="size"):
        paper_qwen3.paper_config("70b")
