"""Evaluates a policy on its own task (`gdro_jax.eval.evaluate_policy`): a training run's workdir
or its model/ folder on the chain task's test split, any other HF folder on the math benchmarks.

    python -m experiments.evaluate --policy=runs/grpo --out=runs/grpo_eval

Several processes (hosts, or one process per accelerator): the same command in every process,
plus `--coordinator_address`, `--num_processes` and `--process_id`, or `--distributed` (as for
`experiments.train`). Each process samples and grades its share of the math batches on its own
first device and host; process 0 writes the output folder, the same files one process writes.
"""

import os

import jax
from absl import flags

from experiments import _cli
from gdro_jax import data
from gdro_jax import eval as evaluation_lib

F = flags
F.DEFINE_string("policy", None, "Training work directory, its model/ folder, or an HF folder.")
F.DEFINE_string("out", None, "Output folder (reports, completions, resume files).")
F.DEFINE_list("benchmarks", None, f"Math only; default all of {','.join(data.BENCHMARKS)}.")
F.DEFINE_string("data_dir", None, f"Math only; default ${data.DATA_DIR_ENV}, else ../shared/data.")
F.DEFINE_integer("limit", None, "Only the first N problems per benchmark (math) or level (chain).")
SAMPLING = {  # None keeps the task's default, given as (chain task; math)
    "num_samples": (F.DEFINE_integer, "Samples per problem k (8; 8)."),
    "temperature": (F.DEFINE_float, "Sampling temperature, 0: greedy (1.0; 0.6)."),
    "top_p": (F.DEFINE_float, "Nucleus filter, 1: off (1.0; 0.8)."),
    "top_k": (F.DEFINE_integer, "Top-k filter, 0: off (0; 20)."),
    "max_new_tokens": (F.DEFINE_integer, "Math only: most tokens per completion (4096)."),
    "max_prompt_tokens": (F.DEFINE_integer, "Math only: longer prompts: --long_prompts (2048)."),
    "batch_size": (F.DEFINE_integer, "Problems per sampler call (64; 8)."),
    "seed": (F.DEFINE_integer, "Sampling seed (0; 0)."),
}
for _name, (_define, _help) in SAMPLING.items():
    _define(_name, None, _help)
F.DEFINE_enum("long_prompts", "skip", ["skip", "raise"], "Math only: over-long prompts.")
F.DEFINE_integer("num_workers", 2, "Math only: grading worker processes.")
F.DEFINE_float("grader_timeout_s", 5.0, "Math only: per-answer grading time limit.")
F.DEFINE_string("bins_from", None, "Math only: JSON object problem id -> integer bin.")
F.DEFINE_string("bin_field", "level", "Math only: row field holding the difficulty bin.")
F.DEFINE_bool("chat_template", True, "Math only: wrap prompts in the chat template.")
F.DEFINE_enum("dtype", "auto", evaluation_lib.DTYPES, "HF weights; auto: f32 on CPU, else bf16.")
F.DEFINE_bool("save_completions", True, "Write completions.jsonl: texts, answers, verdicts.")
_cli.define_process_flags()


def main(_):
    # Checked here, not marked required: other entry points parse their flags in one process.
    if missing := [name for name in ("policy", "out") if not F.FLAGS[name].value]:
        raise ValueError(f"--{missing[0]} is required (python -m experiments.evaluate --help)")
    several = _cli.join_processes()  # before any device is touched
    values = {name: F.FLAGS[name].value for name in F.FLAGS}
    passed = ("benchmarks", "limit", "dtype", "save_completions", "data_dir", "num_workers")
    passed += ("grader_timeout_s", "bins_from", "bin_field", "chat_template")
    report = evaluation_lib.evaluate_policy(
        values["policy"], values["out"], on_long_prompt=values["long_prompts"],
        sampling={name: values[name] for name in SAMPLING if values[name] is not None},
        **{name: values[name] for name in passed},
    )  # fmt: skip
    if several and jax.process_index() != 0:  # process 0 writes and prints
        return
    print(report.to_markdown(), f"\nWritten to {values['out']}: {os.listdir(values['out'])}")


if __name__ == "__main__":
    _cli.run(main)
