"""The project's own CPU-sized reasoning task: chains of single-digit operations (SPEC 11).

A level-`l` problem is a start digit and `l` operations (`+ - *` with a digit, mod 10, left to
right); the model writes a worked solution one step at a time, graded by exact match of the whole
chain. Levels 1..L (6 to 12) share one table of steps, the training pool is heavy-tailed in the
level, and validation/test splits are held out by content.

Typical use:

    config = tasks.ChainTaskConfig(num_levels=8, tail_base=1.5,
                                   pool_size=tasks.pool_size_for(steps=80, prompts_per_step=64))
    splits = tasks.build_splits(config)                 # train / validation / test row dicts
    pool = tasks.encode_rows(splits.train, config)      # prompt and gold-solution token arrays
    tasks.save_tokenizer(workdir / "tokenizer")         # AutoTokenizer.from_pretrained-able
    gold_DS = jnp.asarray(pool.solution_tokens)         # gold solutions of the D pool prompts
    reward_R = tasks.solution_reward(result.tokens, gold_DS[prompt_of_slot],   # jittable
                                     completion_lengths=result.lengths, reward_values=(-1.0, 1.0))
    warm = tasks.supervised_arrays(tasks.pretraining_rows(config, 51_200, seed=0), config)

What the trainer trains on is an `RLTask`: a tokenised prompt pool and its reward, built by
`chain_task` (this task, rewarded on the device) or `math_task` (a math dataset preset graded
by math-verify workers on the host).
"""

from gdro_jax.tasks._arrays import ChainArrays, SupervisedArrays, encode_rows, supervised_arrays
from gdro_jax.tasks._chains import ChainSplits, build_splits, make_problem, pretraining_rows
from gdro_jax.tasks._config import (
    MAX_LEVELS,
    MIN_LEVELS,
    OPERATIONS,
    ChainTaskConfig,
    level_counts,
    level_shares,
    pool_size_for,
    problem_space_size,
)
from gdro_jax.tasks._reward import grade_text, grade_tokens, solution_correct, solution_reward
from gdro_jax.tasks._rl_task import (
    ON_LONG_PROMPT,
    TASK_KINDS,
    MathTaskConfig,
    RewardFn,
    RLTask,
    chain_task,
    check_vocab,
    math_task,
    prompt_features,
)
from gdro_jax.tasks._tokenizer import (
    BOS_ID,
    BOS_TOKEN,
    EOS_ID,
    EOS_TOKEN,
    PAD_ID,
    PAD_TOKEN,
    SYMBOLS,
    VOCAB,
    VOCAB_SIZE,
    build_tokenizer,
    decode,
    encode_prompts,
    encode_solutions,
    hf_tokenizer,
    save_tokenizer,
)

__all__ = [
    "BOS_ID",
    "BOS_TOKEN",
    "EOS_ID",
    "EOS_TOKEN",
    "MAX_LEVELS",
    "MIN_LEVELS",
    "OPERATIONS",
    "PAD_ID",
    "PAD_TOKEN",
    "SYMBOLS",
    "ON_LONG_PROMPT",
    "TASK_KINDS",
    "MathTaskConfig",
    "VOCAB",
    "VOCAB_SIZE",
    "ChainArrays",
    "ChainSplits",
    "ChainTaskConfig",
    "RLTask",
    "RewardFn",
    "SupervisedArrays",
    "build_splits",
    "build_tokenizer",
    "chain_task",
    "check_vocab",
    "decode",
    "encode_prompts",
    "encode_rows",
    "encode_solutions",
    "grade_text",
    "grade_tokens",
    "hf_tokenizer",
    "level_counts",
    "prompt_features",
    "level_shares",
    "make_problem",
    "math_task",
    "pool_size_for",
    "pretraining_rows",
    "problem_space_size",
    "save_tokenizer",
    "solution_correct",
    "solution_reward",
    "supervised_arrays",
]
