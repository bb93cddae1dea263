"""The warm start: solution-only loss, a short real run, the saved folder, reuse, sharding."""

import json

import jax.numpy as jnp
import numpy as np
import pytest

from experiments.configs import pretrain_tiny
from gdro_jax import configs, losses, models, tasks, warmstart
from gdro_jax import eval as evaluation
from gdro_jax.warmstart import _pretrain


def _tiny_config():
    config = pretrain_tiny.get_config()
    config.progress = False
    config.task.update(num_levels=6, pool_size=64, validation_per_level=3, test_per_level=3)
    config.model.update(
        d_model=32, num_layers=2, num_heads=2, num_kv_heads=1, head_dim=16, mlp_dim=64
    )
    config.train.update(steps=30, batch_size=16, learning_rate=1e-2, warmup_steps=2)
    config.eval.update(num_samples=2, batch_size=9)
    return config


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """One real warm start on the tiny config; the trained model is captured on its way out."""
    config = _tiny_config()
    workdir = tmp_path_factory.mktemp("warm_start")
    captured = []

    def capture(*args, **kwargs):
        captured.append(original(*args, **kwargs))
        return captured[-1]

    original = _pretrain.pretrain_model
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(_pretrain, "pretrain_model", capture)
        path = _pretrain.pretrain(config, workdir)
    (trained,) = captured
    return config, workdir, path, trained


def _batch(config, num_rows=8):
    task = warmstart.task_config(config)
    return tasks.supervised_arrays(tasks.pretraining_rows(task, num_rows, seed=5), task)


def test_loss_decreases(run):
    *_, trained = run
    losses = trained.losses
    assert losses.shape == (30,) and np.all(np.isfinite(losses))
    assert losses[:3].mean() == pytest.approx(np.log(tasks.VOCAB_SIZE), abs=0.3)
    assert losses[-5:].mean() < losses[:5].mean() - 0.5


def test_only_solution_targets_enter_the_loss():
    config = _tiny_config()
    model = models.init_decoder(warmstart.decoder_config(config), seed=1)
    data = _batch(config)
    tokens_BQ = jnp.asarray(data.tokens)
    inputs_BT = tokens_BQ[:, :-1]
    logits_BTV = model(inputs_BT, jnp.broadcast_to(jnp.arange(inputs_BT.shape[1]), inputs_BT.shape))
    targets_BT = np.asarray(data.tokens[:, 1:])
    weights_BT = data.loss_mask[:, 1:]
    loss = losses.masked_cross_entropy(logits_BTV, targets_BT, weights_BT)

    # Numpy reference: mean negative log-likelihood of the solution targets.
    logits = np.asarray(logits_BTV, np.float64)
    log_probs = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    nll = -np.take_along_axis(log_probs, targets_BT[..., None], -1)[..., 0]
    assert float(loss) == pytest.approx(nll[weights_BT > 0].mean(), rel=1e-5)
    assert float(warmstart.supervised_loss(model, tokens_BQ, data.loss_mask)) == pytest.approx(
        float(loss), rel=1e-6
    )

    # The weighted targets are exactly each row's solution and its <eos>.
    rows = tasks.pretraining_rows(warmstart.task_config(config), 8, seed=5)
    for i, row in enumerate(rows):
        ids = targets_BT[i][weights_BT[i] > 0]
        assert tasks.decode(ids, skip_special_tokens=False) == row["solution"] + tasks.EOS_TOKEN

    # Changing every prompt-only (or padding) target leaves the loss unchanged ...
    changed_BT = np.where(weights_BT > 0, targets_BT, (targets_BT + 5) % tasks.VOCAB_SIZE)
    assert np.any(changed_BT != targets_BT)
    same = losses.masked_cross_entropy(logits_BTV, changed_BT, weights_BT)
    assert float(same) == float(loss)
    # ... while changing one solution target changes it.
    row, column = np.argwhere(weights_BT > 0)[0]
    changed_BT = targets_BT.copy()
    changed_BT[row, column] = (changed_BT[row, column] + 1) % tasks.VOCAB_SIZE
    assert float(losses.masked_cross_entropy(logits_BTV, changed_BT, weights_BT)) != float(loss)


def test_reloaded_folder_gives_identical_logits(run):
    config, _, path, trained = run
    reloaded = models.from_pretrained(path)
    tokens_BQ = jnp.asarray(_batch(config).tokens)
    positions_BQ = jnp.broadcast_to(jnp.arange(tokens_BQ.shape[1]), tokens_BQ.shape)
    np.testing.assert_array_equal(
        np.asarray(reloaded(tokens_BQ, positions_BQ)),
        np.asarray(trained.model(tokens_BQ, positions_BQ)),
    )
    assert reloaded.config.eos_token_ids == (tasks.EOS_ID,)


def test_saved_metrics_match_a_fresh_evaluation(run):
    config, workdir, path, _ = run
    metrics = json.loads((workdir / warmstart.FRONTIER_FILE).read_text())
    assert metrics["config_hash"] == warmstart.config_hash(config)
    assert sorted(metrics["evaluation"]["levels"]) == [str(level) for level in range(1, 7)]
    assert set(metrics["frontier"]) >= {"easiest_pass@1", "hardest_pass@1", "satisfied"}
    # The stored counts are those of the saved model on the validation split with the same key.
    task = warmstart.task_config(config)
    settings = evaluation.EvalSettings.of(
        "chain",
        seed=config.eval.seed,
        num_samples=config.eval.num_samples,
        batch_size=config.eval.batch_size,
    )
    again = evaluation.evaluate_chain(
        models.from_pretrained(path), tasks.build_splits(task).validation, task, settings
    )
    assert again.correct.tolist() == metrics["evaluation"]["correct"]
    # The tokenizer folders load with transformers and encode like the task.
    tokenizer = models.load_tokenizer(workdir / warmstart.TOKENIZER_DIR)
    assert tokenizer("3+4=").input_ids == tasks.encode_prompts(["3+4="], 5)[0][0].tolist()
    assert models.load_tokenizer(path)("3+4=").input_ids == tokenizer("3+4=").input_ids


def test_reuse_skips_training(run, monkeypatch, capsys):
    config, workdir, path, _ = run
    weights = path / "model.safetensors"
    stamp = weights.stat().st_mtime_ns

    def fail(*args, **kwargs):
        raise AssertionError("pretrain_model must not run when the folder is reusable")

    monkeypatch.setattr(_pretrain, "pretrain_model", fail)
    config.progress = True  # not part of the hash
    assert _pretrain.pretrain(config, workdir) == path
    assert weights.stat().st_mtime_ns == stamp
    assert "reusing" in capsys.readouterr().out


def test_config_hash_tracks_training_fields_only():
    config = _tiny_config()
    digest = warmstart.config_hash(config)
    config.progress = not config.progress
    assert warmstart.config_hash(config) == digest
    config.train.steps += 1
    assert warmstart.config_hash(config) != digest


def test_make_optimizer_rejects_bad_schedules():
    config = _tiny_config()

    def optimizer():
        return configs.OptimizerConfig.from_block(config.train)

    config.train.warmup_steps = config.train.steps
    with pytest.raises(ValueError, match="warmup_steps"):
        configs.make_optimizer(optimizer(), decay_steps=config.train.steps)
    config.train.warmup_steps, config.train.learning_rate = 0, 0.0
    with pytest.raises(ValueError, match="learning_rate"):
        configs.make_optimizer(optimizer(), decay_steps=config.train.steps)


@pytest.mark.slow
def test_sharded_training_matches_one_device(run):
    config, *_, one = run  # the fixture's one-device warm start
    mesh = models.make_mesh(data=2, fsdp=2)
    sharded = _pretrain.pretrain_model(config, mesh=mesh)
    np.testing.assert_allclose(sharded.losses, one.losses, rtol=1e-5)
    tokens_BQ = jnp.asarray(_batch(config).tokens)
    positions_BQ = jnp.broadcast_to(jnp.arange(tokens_BQ.shape[1]), tokens_BQ.shape)
    # 30 Adam steps at lr 1e-2 carry the sharded sums' rounding into the weights: logits of
    # magnitude ~2 differ by up to ~1.5e-4 (measured). A misplaced batch or weight is O(1).
    np.testing.assert_allclose(
        np.asarray(sharded.model(tokens_BQ, positions_BQ)),
        np.asarray(one.model(tokens_BQ, positions_BQ)),
        atol=1e-3,
    )
    embed = sharded.model.embed[...]
    assert embed.sharding.mesh.shape == mesh.shape


def test_check_frontier_reads_the_easiest_and_hardest_levels():
    levels = np.repeat(np.arange(1, 7), 10)
    # Level 1: 9 of 10 samples correct on every problem; level 6: one correct sample in total.
    correct = np.where(levels == 1, 9, 0)
    correct[-1] = 1
    by_level, pooled = evaluation.summarize_counts(correct, 10, levels, num_resamples=20)
    result = evaluation.ChainEvaluation(10, by_level, pooled, correct, levels)
    frontier = warmstart.check_frontier(
        result, easiest_min_pass1=0.8, hardest_max_pass1=0.05, hardest_k=8
    )
    assert frontier["easiest_pass@1"] == pytest.approx(0.9)
    assert frontier["hardest_pass@1"] == pytest.approx(0.01)
    assert frontier["hardest_pass@8"] == pytest.approx(0.08)
    assert frontier["satisfied"]
    correct[-1] = 0
    by_level, pooled = evaluation.summarize_counts(correct, 10, levels, num_resamples=20)
    result = evaluation.ChainEvaluation(10, by_level, pooled, correct, levels)
    frontier = warmstart.check_frontier(
        result, easiest_min_pass1=0.8, hardest_max_pass1=0.05, hardest_k=8
    )
    assert not frontier["satisfied"]  # the hardest level is never solved
