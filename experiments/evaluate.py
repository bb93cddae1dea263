"""Evaluates a policy on its own task (`gdro_jax.eval.evaluate_policy`): a training run's workdir
or its model/ folder on the chain task's test split, any other HF folder on the math benchmarks.

    python -m experiments.evaluate --policy=runs/grpo --out=runs/grpo_eval

Several processes (hosts, or one process per accelerator): the same command in every process,
plus `--coordinator_address`, `--num_processes` and `--process_id`, or `--distributed` (as for
`experiments.train`). Each process samples and grades its share of the math batches on its own
first device and host; process 0 writes the output folder, the same files one process writes.
"""

from absl import flags as F

from experiments import _cli
from gdro_jax import data, runtime
from gdro_jax import eval as evaluation_lib

F.DEFINE_string("policy", None, "Training work directory, its model/ folder, or an HF folder.")
F.DEFINE_string("out", None, "Output folder (reports, completions, resume files).")
F.DEFINE_list("benchmarks", None, f"Math only; default all of {','.join(data.BENCHMARKS)}.")
F.DEFINE_string("data_dir", None, f"Math only; default ${data.DATA_DIR_ENV}, else ../shared/data.")
F.DEFINE_integer("limit", None, "Only the first N problems per benchmark (math) or level (chain).")
for _name, (_kind, _help) in evaluation_lib.SAMPLING_FLAGS.items():  # None: the task's default
    getattr(F, f"DEFINE_{_kind}")(_name, None, _help)
F.DEFINE_enum("long_prompts", "skip", ["skip", "raise"], "Math only: over-long prompts.")
F.DEFINE_integer("num_workers", 2, "Math only: grading worker processes.")
F.DEFINE_float("grader_timeout_s", 5.0, "Math only: per-answer grading time limit.")
F.DEFINE_string("bins_from", None, "Math only: JSON object problem id -> integer bin.")
F.DEFINE_string("bin_field", "level", "Math only: row field holding the difficulty bin.")
F.DEFINE_bool("chat_template", True, "Math only: wrap prompts in the chat template.")
F.DEFINE_enum("dtype", "auto", evaluation_lib.DTYPES, "HF weights; auto: f32 on CPU, else bf16.")
F.DEFINE_bool("save_completions", True, "Write completions.jsonl: texts, answers, verdicts.")
_cli.define_process_flags()
OUTPUTS = {
    "report.md": "the table above, in Markdown",
    "report.json": "every figure, per level or benchmark, with intervals",
    "completions.jsonl": "every completion with its answer and verdict",
}
_PASSED = ("benchmarks", "limit", "dtype", "save_completions", "data_dir", "num_workers")
_PASSED += ("grader_timeout_s", "bins_from", "bin_field", "chat_template")


def main(_):
    _cli.join_processes()  # before any device is touched
    values = {name: F.FLAGS[name].value for name in F.FLAGS}
    sampling = {name: values[name] for name in evaluation_lib.SAMPLING_FLAGS}
    report = evaluation_lib.evaluate_policy(
        values["policy"], values["out"], on_long_prompt=values["long_prompts"],
        sampling={name: value for name, value in sampling.items() if value is not None},
        **{name: values[name] for name in _PASSED},
    )  # fmt: skip
    if runtime.is_primary():  # process 0 writes and prints
        print(report.to_markdown() + "\n")
        print(_cli.wrote(values["out"], OUTPUTS))


if __name__ == "__main__":
    _cli.run(main, required=("policy", "out"))
