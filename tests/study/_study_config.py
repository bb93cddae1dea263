"""The tiny study of `test_compare.py`: `experiments/configs/study.py` with 2 arms x 2 seeds x 3
steps (evaluated after steps 1, 2 and 3), a 1-layer warm start of 20 steps and 2 samples per
test problem (loaded in process and by
`--config=tests/study/_study_config.py` in the rerun-alone subprocess)."""

import ml_collections

from experiments.configs import study

TASK = dict(num_levels=6, pool_size=48, validation_per_level=2, test_per_level=3)
MODEL = dict(d_model=32, num_layers=1, num_heads=2, num_kv_heads=1, head_dim=16, mlp_dim=64)


def shrink(config: ml_collections.ConfigDict) -> None:
    """Cuts a study's or the demo's config (`pretrain`, `train`, `eval` blocks) to tiny sizes."""
    # Rebuilt, not updated: the study's `test_per_level` is a tuple, the tiny one an int.
    config.pretrain.task = ml_collections.ConfigDict({**config.pretrain.task.to_dict(), **TASK})
    config.pretrain.model.update(MODEL)
    config.pretrain.train.update(steps=20, batch_size=16, warmup_steps=2)
    config.pretrain.eval.update(num_samples=2, batch_size=12)
    config.train.task = ml_collections.ConfigDict({**config.train.task.to_dict(), **TASK})
    config.train.model.update(MODEL)
    config.train.update(steps=3, num_prompts=4, max_new_tokens=36)
    config.eval.update(num_samples=2, batch_size=18)


def get_config() -> ml_collections.ConfigDict:
    config = study.get_config()
    config.name = "tiny"  # its block in a results file
    config.arms = ml_collections.ConfigDict(
        {"grpo": "method=grpo", "gdro_both": "method=gdro_both"}
    )
    config.run = "grpo,gdro_both"
    config.seeds = 2
    config.jobs = 1
    config.progress = False
    shrink(config)
    config.train.checkpoint.every_steps = 2
    config.train.checkpoint.snapshot_steps = (1, 2)  # evaluated along the run, then at step 3
    config.primary.update(metric="pass@2", num_resamples=200)
    return config
