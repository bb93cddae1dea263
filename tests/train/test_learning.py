"""A real learning test: 30 GRPO steps on the chain task raise the reward of a small warm start."""

import numpy as np
import pytest
from flax import nnx

from experiments.configs import pretrain_tiny, tiny_cpu
from gdro_jax import eval as evaluation
from gdro_jax import models, train
from gdro_jax.warmstart import pretrain_model

pytestmark = pytest.mark.slow  # about two minutes: a warm start, then 30 RL steps


def test_thirty_grpo_steps_raise_the_reward(tmp_path):
    # A small, quick warm start: 6 levels, a 2-layer width-64 policy, 400 supervised steps. It
    # solves about a quarter of the pool (mean@8 0.24), which leaves room for RL to help.
    warm = pretrain_tiny.get_config()
    warm.progress = False
    warm.task.update(
        num_levels=6, tail_base=1.5, pool_size=96, validation_per_level=4, test_per_level=4, seed=0
    )
    warm.model.update(d_model=64, num_layers=2, num_heads=2, num_kv_heads=1, head_dim=32)
    warm.model.mlp_dim = 128
    # Every field that shapes the result is set here, so tuning the demo's warm start
    # (experiments/configs/pretrain_tiny.py) cannot change this test.
    warm.seed = 0
    warm.train.update(
        steps=400,
        batch_size=64,
        learning_rate=3e-3,
        warmup_steps=10,
        tail_base=1.5,
        data_seed=0,
        grad_clip=1.0,
        weight_decay=0.0,
        end_lr_fraction=0.0,
        b1=0.9,
        b2=0.999,
        eps=1e-8,
    )
    models.save_pretrained(pretrain_model(warm).model, tmp_path / "warm")

    config = tiny_cpu.get_config()
    config.update(progress=False, tensorboard=False, method="grpo", seed=0)
    config.task = warm.task
    config.init_from = str(tmp_path / "warm")
    config.num_prompts = 32
    config.max_new_tokens = 36  # the longest solution at 6 levels
    config.optimizer.learning_rate = 3e-4
    run = train.build_run(config)
    state, rewards = run.state, []
    for _ in range(30):
        state, metrics, _ = train.run_step(run, state, next(run.prompt_batches))
        rewards.append(float(metrics["reward"]))

    first, last = np.mean(rewards[:10]), np.mean(rewards[-10:])
    assert last > first + 0.05, (first, last)

    # The same 96 pool problems, 8 samples each, with the same key, before and after RL: the
    # expected reward itself went up, by more than the bootstrap intervals' half-widths.
    def pool_accuracy(model):
        settings = evaluation.EvalSettings.of("chain", seed=5, batch_size=96)
        result = evaluation.evaluate_chain(model, run.splits.train, run.task_config, settings)
        return result.pooled.mean, result.pooled.mean_interval

    before, before_interval = pool_accuracy(models.from_pretrained(tmp_path / "warm"))
    after, after_interval = pool_accuracy(nnx.merge(run.program.graphdef, state.params))
    assert after > before + 0.05, (before, after)
    assert after_interval[0] > before_interval[1], (before_interval, after_interval)
