"""Tiny RL configs for the trainer tests: `tiny_cpu` shrunk so one step compiles in seconds."""

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
