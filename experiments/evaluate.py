"""Math evaluation of a policy: k samples per problem on the six benchmarks, pass@k tables.

    python -m experiments.evaluate --policy=/models/Qwen3-1.7B --out=runs/eval_qwen3 \
        [--benchmarks=math500,aime24 --limit=50 --num_samples=8 --temperature=0.6 --top_p=0.8 \
         --top_k=20 --max_new_tokens=4096 --batch_size=8 --bins_from=bins.json]

Writes reports and resume files (`settings.json`, `samples.jsonl`) to `--out`.
"""

import dataclasses

from absl import app, flags

from experiments import _cli
from gdro_jax import data
from gdro_jax import eval as evaluation_lib

F = flags
_POLICY = F.DEFINE_string("policy", None, "HF model folder, or a training run's workdir.")
_OUT = F.DEFINE_string("out", None, "Output folder (reports and resume files).")
_BENCHMARKS = F.DEFINE_list("benchmarks", list(data.BENCHMARKS), "Benchmarks to evaluate.")
_DATA_DIR = F.DEFINE_string("data_dir", None, f"Default ${data.DATA_DIR_ENV}, else ../shared/data.")
_LIMIT = F.DEFINE_integer("limit", None, "Evaluate only the first N problems per benchmark.")
F.DEFINE_integer("num_samples", 8, "Samples per problem (k).")
F.DEFINE_float("temperature", 0.6, "Sampling temperature (0: greedy).")
F.DEFINE_float("top_p", 0.8, "Nucleus filter (1: off).")
F.DEFINE_integer("top_k", 20, "Top-k filter (0: off).")
F.DEFINE_integer("max_new_tokens", 4096, "Most tokens per completion.")
F.DEFINE_integer("max_prompt_tokens", 2048, "Longer prompts: --long_prompts.")
_LONG_PROMPTS = F.DEFINE_enum("long_prompts", "skip", ["skip", "raise"], "Over-long prompts.")
F.DEFINE_integer("batch_size", 8, "Problems per sampler call.")
F.DEFINE_integer("seed", 0, "Sampling seed.")
_NUM_WORKERS = F.DEFINE_integer("num_workers", 2, "Grading worker processes.")
_GRADER_TIMEOUT_S = F.DEFINE_float("grader_timeout_s", 5.0, "Per-answer grading time limit.")
_BINS_FROM = F.DEFINE_string("bins_from", None, "JSON object problem id -> integer bin.")
_BIN_FIELD = F.DEFINE_string("bin_field", "level", "Row field holding the difficulty bin.")
_CHAT_TEMPLATE = F.DEFINE_bool("chat_template", True, "Wrap prompts in the chat template.")
_DTYPE = F.DEFINE_enum("dtype", "bfloat16", ["float32", "bfloat16"], "Parameter dtype.")


def main(_):
    # Checked here, not marked required: other entry points parse their flags in one process.
    if missing := [name for name in ("policy", "out") if not F.FLAGS[name].value]:
        raise app.UsageError(f"--{missing[0]} is required")
    fields = {f.name for f in dataclasses.fields(evaluation_lib.MathEvalSettings)} & set(F.FLAGS)
    settings = evaluation_lib.MathEvalSettings(**{name: F.FLAGS[name].value for name in fields})
    if unknown := [name for name in _BENCHMARKS.value if name not in data.PRESETS]:
        raise app.UsageError(f"unknown benchmark {unknown[0]!r}; known: {data.BENCHMARKS}")
    evaluation = evaluation_lib.evaluate_math_policy(
        _POLICY.value, _OUT.value, benchmarks=_BENCHMARKS.value, settings=settings,
        data_dir=_DATA_DIR.value, limit=_LIMIT.value, dtype=_DTYPE.value,
        num_workers=_NUM_WORKERS.value, grader_timeout_s=_GRADER_TIMEOUT_S.value,
        bins_from=_BINS_FROM.value, bin_field=_BIN_FIELD.value,
        chat_template=_CHAT_TEMPLATE.value, on_long_prompt=_LONG_PROMPTS.value,
    )  # fmt: skip
    print(evaluation.to_markdown())


if __name__ == "__main__":
    _cli.run(main)
