"""The chain task and the policy shape shared by the warm start and the RL runs.

`pretrain_tiny.py` and `tiny_cpu.py` both take their `task` and `model` from here: an RL run
loads the warm-start folder with `init_from`, so both must describe the same task (its held-out
splits stay out of training) and the same architecture.

Two task profiles: `cliff` (the default, the study's task, unchanged) and `graded` (issue 16's
profile where the adversaries' premise holds; `graded.py` and `pretrain_graded.py` use it, and
their docstrings hold the measurements that chose it).
"""

import ml_collections

# The graded profile's task fields beside the cliff's (issue 16; chosen on validation, see
# graded.py): 10 levels, so the warm start's frontier sits past a run of graded levels; the
# cliff's pool tail; a pool of 30 steps x 16 prompts, so the first pass over it ends at step 30
# and a 150-step run visits each prompt 5 times (SPEC 11). Its longest chain needs 60 new tokens
# and 83 positions, within `model()`'s 128.
GRADED_TASK = dict(num_levels=10, tail_base=1.5, pool_size=480)


PROFILES = ("cliff", "graded")


def task(
    test_per_level: int | tuple[int, ...] = 100, profile: str = "cliff"
) -> ml_collections.ConfigDict:
    """8 levels with a heavy tail (share 1.5^-level); pool <= steps x prompts / 5 for revisits.

    `test_per_level`: one count for every level or one per level (`ChainTaskConfig`); a
    ConfigDict keeps the type it was built with, so a tuple is given here, not assigned later.
    `profile`: `cliff` (the study's task: a pool of 384) or `graded` (`GRADED_TASK` above).
    """
    if profile not in PROFILES:
        raise ValueError(f"profile must be one of {PROFILES}, got profile={profile!r}")
    fields = dict(
        num_levels=8,
        tail_base=1.5,
        pool_size=384,
        validation_per_level=32,
        test_per_level=test_per_level,
        seed=0,
    )
    if profile == "graded":
        fields.update(GRADED_TASK)
    return ml_collections.ConfigDict(fields)


def model() -> dict:
    """A 0.79M-parameter Qwen3-shaped policy over the task's 18 symbols (4 layers, GQA 4/2); the
    other architecture fields keep `DecoderConfig`'s defaults."""
    return dict(
        vocab_size=18,
        d_model=128,
        num_layers=4,
        num_heads=4,
        num_kv_heads=2,
        head_dim=32,
        mlp_dim=384,
        rope_theta=10_000.0,
        max_position_embeddings=128,
    )
