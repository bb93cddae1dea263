"""Math evaluation of a policy: k samples per problem on the six benchmarks, pass@k tables.

    python -m experiments.evaluate --policy=/models/Qwen3-1.7B --out=runs/eval_qwen3 \
        [--benchmarks=math500,aime24 --limit=50 --num_samples=8 --temperature=0.6 --top_p=0.8 \
         --top_k=20 --max_new_tokens=4096 --batch_size=8 --bins_from=bins.json]

Writes `report.json` and `report.md` to `--out`, with `settings.json` and `samples.jsonl`, which
make a rerun into the same folder resume where an interrupted run stopped (see
`gdro_jax.eval.evaluate_math`).
"""

from __future__ import annotations

import logging
import os

import jax.numpy as jnp
from absl import app, flags

from gdro_jax import data, models, rewards, train
from gdro_jax import eval as evaluation_lib

_POLICY = flags.DEFINE_string(
    "policy", None, "HF model folder: config.json, *.safetensors and the tokenizer files."
)
_OUT = flags.DEFINE_string("out", None, "Output folder (reports and resume files).")
_BENCHMARKS = flags.DEFINE_list("benchmarks", list(data.BENCHMARKS), "Benchmarks to evaluate.")
_DATA_DIR = flags.DEFINE_string(
    "data_dir", None, f"Benchmark files; default ${data.DATA_DIR_ENV}, else ../shared/data."
)
_LIMIT = flags.DEFINE_integer("limit", None, "Evaluate only the first N problems per benchmark.")
_NUM_SAMPLES = flags.DEFINE_integer("num_samples", 8, "Samples per problem (k).")
_TEMPERATURE = flags.DEFINE_float("temperature", 0.6, "Sampling temperature (0: greedy).")
_TOP_P = flags.DEFINE_float("top_p", 0.8, "Nucleus filter (1: off).")
_TOP_K = flags.DEFINE_integer("top_k", 20, "Top-k filter (0: off).")
_MAX_NEW_TOKENS = flags.DEFINE_integer("max_new_tokens", 4096, "Most tokens per completion.")
_MAX_PROMPT_TOKENS = flags.DEFINE_integer(
    "max_prompt_tokens", 2048, "Longer prompts are skipped and counted (or raise, see below)."
)
_LONG_PROMPTS = flags.DEFINE_enum(
    "long_prompts", "skip", ["skip", "raise"], "What to do with a prompt over the limit."
)
_BATCH_SIZE = flags.DEFINE_integer("batch_size", 8, "Problems per sampler call.")
_SEED = flags.DEFINE_integer("seed", 0, "Sampling seed.")
_NUM_WORKERS = flags.DEFINE_integer("num_workers", 2, "Grading worker processes.")
_GRADER_TIMEOUT_S = flags.DEFINE_float("grader_timeout_s", 5.0, "Per-answer grading time limit.")
_BINS_FROM = flags.DEFINE_string(
    "bins_from", None, "JSON object problem id -> integer bin (else the rows' --bin_field)."
)
_BIN_FIELD = flags.DEFINE_string("bin_field", "level", "Row field holding the difficulty bin.")
_CHAT_TEMPLATE = flags.DEFINE_bool(
    "chat_template", True, "Wrap prompts in the tokenizer's chat template when it has one."
)
_DTYPE = flags.DEFINE_enum("dtype", "bfloat16", ["float32", "bfloat16"], "Parameter dtype.")
# --policy and --out are checked in main rather than marked required: a required-flag validator
# would fire in every other absl entry point's flag parse within one process (tests).

_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")


def load_policy(path: str | os.PathLike, *, dtype: str = "bfloat16"):
    """Loads a policy to evaluate: a HuggingFace model folder, or a training run's checkpoint.

    Args:
      path: a folder holding `config.json`, `*.safetensors` (or an index) and tokenizer files;
        or a training work directory holding `checkpoints/`, whose newest usable checkpoint is
        read (the run's config rebuilds the policy and its tokenizer).
      dtype: parameter dtype ("float32" or "bfloat16") of an HF folder's weights.

    Returns:
      `(model, tokenizer)`: a `gdro_jax.models.Decoder` and a transformers tokenizer.

    Raises:
      FileNotFoundError: naming the folder and what it lacks.
    """
    path = os.fspath(path)
    if not os.path.isdir(path):
        raise FileNotFoundError(f"policy={path!r} is not a folder")
    names = set(os.listdir(path))
    weights = any(name.endswith(".safetensors") or name.endswith(".index.json") for name in names)
    if not weights and "checkpoints" in names:
        model, tokenizer, step = train.policy_from_checkpoint(path)
        logging.info("evaluating %s at checkpoint step %d", path, step)
        return model, tokenizer
    if "config.json" not in names:
        raise FileNotFoundError(
            f"policy={path!r} is not a model folder (no config.json) nor a training work "
            "directory (no checkpoints/)"
        )
    if not weights:
        raise FileNotFoundError(
            f"policy={path!r} is not a model folder: it has no *.safetensors weights"
        )
    if not names & set(_TOKENIZER_FILES):
        raise FileNotFoundError(
            f"policy={path!r} has no tokenizer (none of {', '.join(_TOKENIZER_FILES)}); save one "
            "into the folder, e.g. models.save_pretrained(model, path, tokenizer=tokenizer)"
        )
    model = models.from_pretrained(path, dtype=jnp.dtype(dtype))
    return model, models.load_tokenizer(path)


def main(argv):
    del argv
    for holder in (_POLICY, _OUT):
        if not holder.value:
            raise app.UsageError(f"--{holder.name} is required")
    model, tokenizer = load_policy(_POLICY.value, dtype=_DTYPE.value)
    unknown = [name for name in _BENCHMARKS.value if name not in data.PRESETS]
    if unknown:
        raise app.UsageError(f"unknown benchmark {unknown[0]!r}; known: {data.BENCHMARKS}")
    templated = _CHAT_TEMPLATE.value and bool(getattr(tokenizer, "chat_template", None))
    benchmarks = {
        name: data.load_preset(name, _DATA_DIR.value, tokenizer=tokenizer if templated else None)[
            : _LIMIT.value
        ]
        for name in _BENCHMARKS.value
    }
    settings = evaluation_lib.MathEvalSettings(
        num_samples=_NUM_SAMPLES.value,
        temperature=_TEMPERATURE.value,
        top_p=_TOP_P.value,
        top_k=_TOP_K.value,
        max_new_tokens=_MAX_NEW_TOKENS.value,
        max_prompt_tokens=_MAX_PROMPT_TOKENS.value,
        batch_size=_BATCH_SIZE.value,
        seed=_SEED.value,
    )
    bins = evaluation_lib.load_bins(_BINS_FROM.value) if _BINS_FROM.value else None
    with rewards.MathGrader(_NUM_WORKERS.value, _GRADER_TIMEOUT_S.value) as grader:
        evaluation = evaluation_lib.evaluate_math(
            model,
            tokenizer,
            benchmarks,
            grader=grader,
            out_dir=_OUT.value,
            settings=settings,
            policy_name=os.path.abspath(_POLICY.value),
            bins=bins,
            bin_field=_BIN_FIELD.value,
            on_long_prompt=_LONG_PROMPTS.value,
            # Chat-templated prompts carry their special tokens as text.
            add_special_tokens=not templated,
        )
    print(evaluation.to_markdown())


if __name__ == "__main__":
    app.run(main)
