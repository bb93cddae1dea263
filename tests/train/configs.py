"""Tiny RL configs for the trainer tests: `tiny_cpu` shrunk so one step compiles in seconds."""

import jax.numpy as jnp
import numpy as np

from experiments.configs import tiny_cpu


def tiny_config(method="grpo", **overrides):
    """`tiny_cpu` with 8 prompts x 4 rollouts of 16 tokens, a 64-problem pool and a 2-layer,
    width-32 policy; `overrides` maps dotted field names (`"mesh.data"`) to values."""
    config = tiny_cpu.get_config()
    config.update(method=method, progress=False, tensorboard=False)
    config.update(num_prompts=8, n_mean=4, max_new_tokens=16)
    config.task.update(pool_size=64, validation_per_level=2, test_per_level=2)
    config.model.update(d_model=32, num_layers=2, num_heads=2, num_kv_heads=1, head_dim=16)
    config.model.mlp_dim = 64
    config.optimizer.learning_rate = 1e-2
    for name, value in overrides.items():
        target = config
        *path, last = name.split(".")
        for part in path:
            target = target[part]
        target[last] = value
    return config


SMALL_RUN = {
    "num_prompts": 4,
    "n_mean": 2,
    "max_new_tokens": 8,
    "task.pool_size": 16,
    "model.num_layers": 1,
}


def small_run_config(method="grpo", **overrides):
    """`tiny_config` cut to 4 prompts x 2 rollouts of 8 tokens, a 16-problem pool and one layer:
    the runs of the checkpoint, resume, guard and bad-input tests."""
    return tiny_config(method, **{**SMALL_RUN, **overrides})


def parity_reward(prompt_ids, tokens, lengths, prompt_of_slot):
    """A jittable reward a random policy earns about half the time: +1 when the first completion
    token is even, else -1 (mixed groups, so advantages and allocations are non-trivial)."""
    del prompt_ids, lengths, prompt_of_slot
    correct = tokens[:, 0] % 2 == 0
    return jnp.where(correct, 1.0, -1.0), correct


def host_parity_reward(prompt_ids, tokens, lengths, prompt_of_slot):
    """`parity_reward` in numpy, for the host reward phase (the same scores)."""
    del prompt_ids, lengths, prompt_of_slot
    correct = np.asarray(tokens)[:, 0] % 2 == 0
    return np.where(correct, 1.0, -1.0).astype(np.float32), correct
