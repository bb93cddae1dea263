"""Tunix's GRPO learner with the controllers inside (`make test-tunix`, the tunix extra).

Tunix's own test pattern: `tunix.tests.test_common`'s toy transformer and mock vocabulary, the
`vanilla` rollout, on CPU. The references are independent of the adapter: Tunix's GRPO
advantages recomputed in numpy from the rewards the reward function returned, and the
controllers' pure functions (`multi_adversary`'s `plan` and `update`, called directly) fed those
rewards by prompt id, counted in a Python loop.

Planted bugs each test was seen failing on: the multipliers not applied to the advantages
(`test_three_steps...`: the trained advantages differ from the reference at step 2); the
rollouts' prompt ids given to `observe` rolled by one prompt (G rows) against their rewards
(`test_three_steps...`: the multipliers, so the trained advantages, differ at step 3); the
skip of a resumed run's trained batches removed from `PromptSource.batches` (the resumed run
draws other prompts from step 3 on).
"""

from __future__ import annotations

import os

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from gdro_jax import controllers
from gdro_jax.integrations import HostControllers

pytestmark = pytest.mark.tunix
tunix_test_common = pytest.importorskip(
    "tunix.tests.test_common", reason="the tunix extra: make test-tunix"
)

from flax import nnx  # noqa: E402
from tunix.rl import rl_cluster as rl_cluster_lib  # noqa: E402
from tunix.rl.grpo import grpo_learner as grpo_lib  # noqa: E402
from tunix.rl.rollout import base_rollout  # noqa: E402

from gdro_jax.integrations import tunix as gdro_tunix  # noqa: E402

# The mock vocabulary's words: the prompts, indexed by prompt id.
PROMPTS = ["input string", "hello world", "My name", "hello there", "Hello", "library"]
G = 4  # Tunix's num_generations


def reward_by_length(prompts, completions, **kwargs):
    """1 for a completion of an even number of characters, else 0: mixed within groups."""
    return [float(len(completion) % 2 == 0) for completion in completions]


def build_cluster(checkpoint_dir: str | None = None, max_steps: int = 3):
    vocab = tunix_test_common.MockVocab()
    model = tunix_test_common.ToyTransformer(
        config=tunix_test_common.ModelConfig(vocab_size=vocab.GetPieceSize()),
        rngs=nnx.Rngs(0),
    )
    mesh = jax.make_mesh((1, 1), ("fsdp", "tp"), axis_types=(jax.sharding.AxisType.Auto,) * 2)
    checkpointing = {}
    if checkpoint_dir is not None:
        import orbax.checkpoint as ocp

        checkpointing = dict(
            checkpoint_root_directory=checkpoint_dir,
            checkpointing_options=ocp.CheckpointManagerOptions(
                save_interval_steps=1, max_to_keep=10
            ),
        )
    roles = (rl_cluster_lib.Role.ACTOR, rl_cluster_lib.Role.REFERENCE, rl_cluster_lib.Role.ROLLOUT)
    config = rl_cluster_lib.ClusterConfig(
        role_to_mesh={role: mesh for role in roles},
        rollout_engine="vanilla",
        offload_to_cpu=False,
        training_config=rl_cluster_lib.RLTrainingConfig(
            actor_optimizer=optax.sgd(1e-2),
            eval_every_n_steps=100,
            max_steps=max_steps,
            **checkpointing,
        ),
        rollout_config=base_rollout.RolloutConfig(
            max_tokens_to_generate=8, max_prompt_length=16, kv_cache_size=32, temperature=1.0
        ),
    )
    cluster = rl_cluster_lib.RLCluster(
        actor=model, reference=None, tokenizer=vocab, cluster_config=config
    )
    return cluster, model


def prompt_gdro_adversary(realisation: str = "reweight") -> controllers.MultiAdversary:
    classifier = controllers.passk_classifier(len(PROMPTS), k=2)
    prompt = controllers.prompt_gdro(realisation=realisation)
    return controllers.multi_adversary(classifier, prompt, n_mean=G)


class Recorder:
    """What Tunix computed and what it trained on, step by step."""

    def __init__(self, cluster):
        self.rewards = []  # per step: [B * G] the reward function's values
        self.prompt_ids = []  # per step: [B * G] the prompt_id field the reward function saw
        self.tunix_advantages = []  # per step: Tunix's own advantages (metric_fns see them)
        self.trained_advantages = []  # per step: what reached the actor's update
        self.metrics = []  # per global step: {name: aggregated value} of the train metrics
        update_actor = cluster.update_actor

        def record_update(train_examples, *args, **kwargs):
            self.trained_advantages.append(
                np.concatenate([np.asarray(e.advantages) for e in train_examples])
            )
            return update_actor(train_examples, *args, **kwargs)

        cluster.update_actor = record_update
        cluster.with_external_metrics_logger(self._log)

    def reward_fn(self, prompts, completions, prompt_id, **kwargs):
        rewards = reward_by_length(prompts, completions)
        self.rewards.append(np.asarray(rewards))
        self.prompt_ids.append(np.asarray(prompt_id))
        return rewards

    def metric_fn(self, prompts, completions, rewards, advantages, **kwargs):
        self.tunix_advantages.append(np.asarray(advantages))
        return {}

    def _log(self, buffer):
        if buffer.mode != "train" or not buffer.metrics:  # the close logs an empty buffer
            return
        values = {}
        for name, (entries, aggregate) in buffer.metrics.items():
            if name.startswith(("gdro/", "rewards/", "completions/")) and aggregate is not None:
                values[name] = float(aggregate(np.asarray(entries, np.float64)))
        self.metrics.append((buffer.global_steps, values))


def grpo_advantages(rewards: np.ndarray) -> np.ndarray:
    """GRPO's group-normalised advantages in numpy: (r - mean) / (sample std + 1e-6)."""
    out = np.empty_like(rewards, dtype=np.float64)
    for start in range(0, rewards.size, G):
        group = rewards[start : start + G].astype(np.float64)
        out[start : start + G] = (group - group.mean()) / (group.std(ddof=1) + 1e-6)
    return out


def reference_controllers(adversary, steps_ids, steps_rewards, seed=0):
    """The pure functions fed the recorded rewards by prompt id: (weights per step, state)."""
    state = adversary.init()
    weights = []
    for step, (ids_of_rollouts, rewards) in enumerate(zip(steps_ids, steps_rewards, strict=True)):
        ids = ids_of_rollouts[::G]
        plan = adversary.plan(state, ids, jax.random.fold_in(jax.random.key(seed), step))
        weights.append(np.asarray(plan.advantage_weights))
        correct = []
        for i in range(len(ids)):  # count each group's correct rollouts by hand
            correct.append(sum(1 for r in rewards[i * G : (i + 1) * G] if r > 0.5))
        failure = [1.0 - c / G for c in correct]
        state = adversary.update(
            state,
            plan._replace(num_rollouts=jnp.full((len(ids),), G, jnp.int32)),
            ids,
            num_correct=jnp.asarray(correct, jnp.int32),
            losses=jnp.asarray(failure, jnp.float32),
            valid=jnp.ones((len(ids),), bool),
        )
    return weights, state


def assert_states_equal(got, want):
    for (path, a), b in zip(
        jax.tree_util.tree_leaves_with_path(got), jax.tree_util.tree_leaves(want), strict=True
    ):
        np.testing.assert_allclose(
            np.asarray(a), np.asarray(b), rtol=1e-6, atol=1e-7, err_msg=jax.tree_util.keystr(path)
        )


def test_three_steps_of_prompt_gdro_train_on_tunix_advantages_times_the_multipliers():
    cluster, model = build_cluster(max_steps=3)
    recorder = Recorder(cluster)
    adversary = prompt_gdro_adversary()
    learner = gdro_tunix.GDROLearner(
        cluster,
        grpo_lib.GRPOConfig(num_generations=G, beta=0.0),
        recorder.reward_fn,
        adversary,
        metric_fns=[recorder.metric_fn],
    )
    # Batches mix seen and unseen prompts, so the bins present differ and the weights move.
    order = [[0, 1], [0, 2], [1, 2]]
    batches = [
        {"prompts": np.array([PROMPTS[i] for i in ids]), "prompt_id": np.array(ids)}
        for ids in order
    ]
    learner.train(batches)

    assert len(recorder.rewards) == 3 and len(recorder.trained_advantages) == 3
    for ids_of_rollouts, ids in zip(recorder.prompt_ids, order, strict=True):
        np.testing.assert_array_equal(ids_of_rollouts, np.repeat(ids, G))
    weights, state = reference_controllers(adversary, recorder.prompt_ids, recorder.rewards)
    assert not np.allclose(np.concatenate(weights), 1.0), "the test needs weights that move"
    for step in range(3):
        tunix_own = grpo_advantages(recorder.rewards[step])
        np.testing.assert_allclose(recorder.tunix_advantages[step], tunix_own, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(
            recorder.trained_advantages[step],
            tunix_own * np.repeat(weights[step], G),
            rtol=1e-5,
            atol=1e-6,
            err_msg=f"step {step + 1}",
        )
    assert learner.controllers.step == 3
    assert_states_equal(learner.controllers.state, state)
    logged = [values["gdro/multiplier_max"] for _, values in recorder.metrics]
    np.testing.assert_allclose(logged, [w.max() for w in weights], rtol=1e-6)


def records():
    return [{"prompts": prompt, "answer": prompt} for prompt in PROMPTS]


def run_with_source(checkpoint_dir, max_steps, adversary):
    cluster, model = build_cluster(checkpoint_dir, max_steps=max_steps)
    recorder = Recorder(cluster)
    learner = gdro_tunix.GDROLearner(
        cluster, grpo_lib.GRPOConfig(num_generations=G, beta=0.0), recorder.reward_fn, adversary
    )
    source = gdro_tunix.PromptSource(learner.controllers, records(), batch_size=2)
    learner.train(source)
    return learner, recorder, model


def test_a_run_stopped_after_step_2_and_resumed_equals_one_uninterrupted_run(tmp_path):
    """Prompt-GDRO's `resample` realisation draws every batch from the controllers' state, so a
    resumed run that drew from a state not restored, or drew again the batches it skipped, would
    train on other prompts."""
    adversary = prompt_gdro_adversary("resample")
    whole, whole_record, whole_model = run_with_source(str(tmp_path / "whole"), 4, adversary)
    first, first_record, _ = run_with_source(str(tmp_path / "resumed"), 2, adversary)
    assert first.controllers.step == 2
    assert sorted(os.listdir(tmp_path / "resumed" / gdro_tunix.STATE_FOLDER)) == [
        "1.msgpack",
        "2.msgpack",
    ]
    resumed, resumed_record, resumed_model = run_with_source(
        str(tmp_path / "resumed"), 4, adversary
    )
    assert resumed.controllers.step == 4
    assert resumed.controllers.to_bytes() == whole.controllers.to_bytes()
    drawn = first_record.prompt_ids + resumed_record.prompt_ids
    for step, (a, b) in enumerate(zip(whole_record.prompt_ids, drawn, strict=True)):
        np.testing.assert_array_equal(a, b, err_msg=f"step {step + 1}'s batch")
    for a, b in zip(
        whole_record.rewards, first_record.rewards + resumed_record.rewards, strict=True
    ):
        np.testing.assert_array_equal(a, b)
    assert dict(whole_record.metrics) == dict(first_record.metrics + resumed_record.metrics)
    params = nnx.state(whole_model, nnx.Param), nnx.state(resumed_model, nnx.Param)
    for a, b in zip(jax.tree.leaves(params[0]), jax.tree.leaves(params[1]), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_a_resume_without_the_controllers_state_is_refused(tmp_path):
    adversary = prompt_gdro_adversary()
    cluster, _ = build_cluster(str(tmp_path), max_steps=1)
    recorder = Recorder(cluster)
    learner = gdro_tunix.GDROLearner(
        cluster, grpo_lib.GRPOConfig(num_generations=G, beta=0.0), recorder.reward_fn, adversary
    )
    learner.train([{"prompts": np.array(PROMPTS[:2]), "prompt_id": np.array([0, 1])}])
    folder = tmp_path / gdro_tunix.STATE_FOLDER
    (folder / "1.msgpack").unlink()
    cluster, _ = build_cluster(str(tmp_path), max_steps=2)
    with pytest.raises(FileNotFoundError, match=r"checkpoint of step 1.*1\.msgpack"):
        gdro_tunix.GDROLearner(
            cluster, grpo_lib.GRPOConfig(num_generations=G, beta=0.0), reward_by_length, adversary
        )


@pytest.mark.parametrize(
    "method, reason",
    [
        ("rollout_gdro", "Tunix's GRPOConfig.num_generations is one number"),
        ("knapsack", "Tunix's GRPOConfig.num_generations is one number"),
        ("dynamic_sampling", "generates once per batch"),
    ],
)
def test_what_tunix_cannot_express_is_refused_with_its_reason(method, reason):
    classifier = controllers.passk_classifier(len(PROMPTS), k=2)
    parts = {
        "rollout_gdro": dict(rollout=controllers.rollout_gdro(n_mean=G)),
        "knapsack": dict(rollout=controllers.knapsack(len(PROMPTS), n_mean=G)),
        "dynamic_sampling": dict(
            group_filter=controllers.dynamic_sampling(2), num_prompts=2, n_mean=G
        ),
    }[method]
    adversary = controllers.multi_adversary(classifier, **parts)
    with pytest.raises(ValueError, match="cannot express this method") as error:
        gdro_tunix.check_expressible(adversary, G)
    assert reason in str(error.value)


def test_a_batch_without_prompt_ids_or_with_other_counts_is_named():
    adversary = prompt_gdro_adversary()
    with pytest.raises(ValueError, match="n_mean=4 rollouts per prompt; Tunix draws"):
        gdro_tunix.check_expressible(adversary, 2)
    with pytest.raises(ValueError, match="no 'prompt_id' field"):
        gdro_tunix._prompt_ids({"prompts": np.array(["a"] * G)}, G)
    with pytest.raises(ValueError, match="differs within a group"):
        gdro_tunix._prompt_ids(
            {"prompts": np.array(["a"] * 2 * G), "prompt_id": np.arange(2 * G)}, G
        )


def _thompson_frequencies(alpha, beta, target):
    """P(prompt i's Beta sample lies nearest the target), by numerical integration."""
    from scipy import integrate, stats

    def survival(a, b, x):
        low, high = max(target - x, 0.0), min(target + x, 1.0)
        return 1.0 - (stats.beta.cdf(high, a, b) - stats.beta.cdf(low, a, b))

    def density(a, b, x):
        d = stats.beta.pdf(target + x, a, b) if target + x <= 1.0 else 0.0
        if target - x >= 0.0 and x > 0:
            d += stats.beta.pdf(target - x, a, b)
        return d

    out = []
    for i in range(len(alpha)):
        others = [j for j in range(len(alpha)) if j != i]

        def integrand(x, i=i, others=others):
            return density(alpha[i], beta[i], x) * np.prod(
                [survival(alpha[j], beta[j], x) for j in others]
            )

        out.append(integrate.quad(integrand, 0.0, max(target, 1 - target), limit=200)[0])
    return np.array(out)


def test_the_mopps_source_draws_what_the_posterior_says():
    """Three prompts with fixed posteriors, a batch of one from all three, 3000 draws through
    the source: each prompt's frequency against the probability that its Beta sample is nearest
    the target. Each step observes the drawn prompt's G rewards (one correct), which moves its
    posterior by MoPPS's rule (checked against that rule by hand), then puts the fixed posterior
    back, so every draw is from it; the step, and so the key, still advances."""
    alpha, beta, target, decay = np.array([2.0, 6.0, 1.0]), np.array([2.0, 2.0, 5.0]), 0.4, 0.5
    sampler = controllers.mopps(3, candidates=3, target=target, decay=decay)
    adversary = controllers.multi_adversary(
        controllers.passk_classifier(3, k=2), sampler=sampler, n_mean=G
    )
    host = HostControllers(adversary, seed=3)
    posterior = adversary.init()._replace(
        sampler=sampler.init()._replace(
            alpha=jnp.asarray(alpha, jnp.float32), beta=jnp.asarray(beta, jnp.float32)
        )
    )
    host._state = posterior  # a fixed posterior to draw from
    records3 = [{"prompts": p} for p in PROMPTS[:3]]
    source = gdro_tunix.PromptSource(host, records3, batch_size=1, num_batches=3000)
    rewards = np.array([1.0] + [0.0] * (G - 1))  # one correct of G
    drawn = []
    for step, batch in enumerate(source):
        drawn.append(int(batch["prompt_id"][0]))
        assert batch["prompts"][0] == PROMPTS[drawn[-1]]
        host.observe(np.repeat(batch["prompt_id"], G), rewards)
        assert host.step == step + 1
        if step < 20:  # the drawn prompt's posterior decays toward the Beta(1, 1) prior and
            # adds its rollouts; the others stay (MoPPS's update, by hand)
            moved_alpha, moved_beta = alpha.copy(), beta.copy()
            moved_alpha[drawn[-1]] = decay * alpha[drawn[-1]] + (1 - decay) + 1
            moved_beta[drawn[-1]] = decay * beta[drawn[-1]] + (1 - decay) + (G - 1)
            np.testing.assert_allclose(host.state.sampler.alpha, moved_alpha, rtol=1e-6)
            np.testing.assert_allclose(host.state.sampler.beta, moved_beta, rtol=1e-6)
        host._state = posterior  # the fixed posterior again, for the next draw
    frequencies = np.bincount(drawn, minlength=3) / len(drawn)
    expected = _thompson_frequencies(alpha, beta, target)
    standard_error = np.sqrt(expected * (1 - expected) / len(drawn))
    np.testing.assert_array_less(np.abs(frequencies - expected), 4 * standard_error + 1e-4)


def test_a_source_for_data_driven_controllers_is_refused():
    host = HostControllers(prompt_gdro_adversary())
    with pytest.raises(ValueError, match="take their batches from the data"):
        gdro_tunix.PromptSource(host, records(), batch_size=2)
    host = HostControllers(prompt_gdro_adversary("resample"))
    with pytest.raises(ValueError, match="records holds 5 prompts; the classifier tracks 6"):
        gdro_tunix.PromptSource(host, records()[:5], batch_size=2)


def test_the_tunix_example_of_the_docs_runs(tmp_path):
    """docs/integrations.md's Tunix block (skipped by tests/test_docs.py, whose environment has no
    Tunix), run as that test runs the others: a fresh interpreter in an empty folder."""
    from tests.test_docs import run_extra_block

    process = run_extra_block("docs/integrations.md", "tunix", tmp_path)
    assert process.returncode == 0, process.stderr[-3000:]
    assert "p_hat" in process.stdout
