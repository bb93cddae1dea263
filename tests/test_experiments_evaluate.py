"""`experiments/evaluate.py` end to end.

- A math policy: a tiny random Qwen3 with a tokenizer trained in the test, 10 MATH500 problems,
  2 samples each; the report and the saved completions.
- A chain-task policy: a 2-step training run of the smallest trainer config, evaluated from its
  work directory and from its `model/` folder on the task's test split.
- Refusals: one line on stderr, exit status 2, and `--out` untouched.
- `open_policy`'s errors for folders that are not policies, and the `auto` dtype.

The entry point runs as a subprocess: parsing absl flags in this process would also run the
required-flag validators of the other entry points that tests import.
"""

import collections
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import pytest
from flax import nnx

from gdro_jax import data, models, rewards, tasks, train
from gdro_jax import eval as evaluation
from tests._subprocesses import free_port, stop
from tests.train.configs import small_run_config

NUM_PROBLEMS = 10
NUM_SAMPLES = 2
REPO_ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def math500(data_dir):
    return data.load_preset("math500", data_dir, suffix=None)


@pytest.fixture(scope="module")
def policy_dir(math500, tmp_path_factory):
    """A random 2-layer, width-64 Qwen3 and a BPE trained on MATH500 problems, as a HF folder."""
    path = tmp_path_factory.mktemp("policy")
    tokenizer = data.build_tokenizer([row["problem"] for row in math500[:200]], vocab_size=512)
    config = models.DecoderConfig.tiny(
        vocab_size=len(tokenizer), eos_token_ids=(tokenizer.eos_token_id,), pad_token_id=0
    )
    models.save_pretrained(models.init_decoder(config, seed=0), path, tokenizer=tokenizer)
    return path


@pytest.fixture(scope="module")
def chain_run(tmp_path_factory):
    """A finished 2-step chain-task training run (2 test problems per level, 8 levels)."""
    workdir = tmp_path_factory.mktemp("chain") / "run"
    train.train(small_run_config(steps=2), workdir)
    return workdir


def _evaluate(argv, *, status=0):
    completed = subprocess.run(
        [sys.executable, "-m", "experiments.evaluate", *argv],
        cwd=REPO_ROOT,
        env=dict(os.environ, JAX_PLATFORMS="cpu"),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert completed.returncode == status, completed.stderr[-3000:]
    return completed


def _snapshot(folder: Path) -> dict[str, bytes] | None:
    if not folder.exists():
        return None
    return {str(p.relative_to(folder)): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


def _math_flags(policy_dir, data_dir, out) -> list[str]:
    # Batches of 4 problems: 4, 4 and 2 (padded); two processes share the first round and
    # process 1 idles in the second.
    return [
        f"--policy={policy_dir}",
        f"--out={out}",
        "--benchmarks=math500",
        f"--data_dir={data_dir}",
        f"--limit={NUM_PROBLEMS}",
        f"--num_samples={NUM_SAMPLES}",
        "--max_new_tokens=16",
        "--batch_size=4",
        "--num_workers=1",
    ]


@pytest.fixture(scope="module")
def math_eval(policy_dir, data_dir, tmp_path_factory):
    """(the output folder, what it printed) of one process evaluating the math policy."""
    out = tmp_path_factory.mktemp("math_eval") / "eval"
    return out, _evaluate(_math_flags(policy_dir, data_dir, out)).stdout


def _without_timing(report_path: Path) -> dict:
    report = json.loads(report_path.read_text())
    # (and the machine record: two processes name two processes)
    del report["timing"], report["grader"]["restarts_this_run"], report["environment"]
    return report


@pytest.mark.slow  # the shipped command end to end; tests/eval pins the evaluation in-process
def test_main_writes_the_report_and_the_completions(policy_dir, math500, math_eval):
    out, printed = math_eval
    report = json.loads((out / "report.json").read_text())
    assert report["num_samples"] == NUM_SAMPLES
    assert list(report["benchmarks"]) == ["math500"]
    math = report["benchmarks"]["math500"]
    assert math["summary"]["num_problems"] == NUM_PROBLEMS
    assert math["skipped_long_prompts"] == 0
    assert set(math["summary"]["pass@k"]) == {str(j) for j in range(1, NUM_SAMPLES + 1)}
    # The per-level table holds exactly the levels of the first 10 problems, with their counts.
    levels = [row["level"] for row in math500[:NUM_PROBLEMS]]
    expected = {str(level): levels.count(level) for level in set(levels)}
    assert {label: s["num_problems"] for label, s in report["bins"].items()} == expected
    assert report["bin_source"] == "field:level"
    assert [p["id"] for p in report["problems"]] == [r["id"] for r in math500[:NUM_PROBLEMS]]
    assert all(p["n"] == NUM_SAMPLES and 0 <= p["c"] <= NUM_SAMPLES for p in report["problems"])
    assert report["pooled"]["num_problems"] == NUM_PROBLEMS
    # A random policy is (near) never right.
    assert report["pooled"][f"mean@{NUM_SAMPLES}"] <= 0.1
    grader = report["grader"]
    total = sum(grader[s] for s in ("correct", "wrong", "no_answer", "timeout", "crash"))
    assert total == NUM_PROBLEMS * NUM_SAMPLES
    assert report["settings"]["policy"] == os.path.abspath(policy_dir)
    assert report["settings"]["temperature"] == 0.6 and report["settings"]["top_k"] == 20
    markdown = (out / "report.md").read_text()
    assert f"| math500 | {NUM_PROBLEMS} |" in markdown
    assert "| bin | problems | pass@1 | pass@2 |" in markdown
    assert markdown in printed
    samples = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    assert len(samples) == NUM_PROBLEMS

    # Each problem's text, and each completion's text, extracted answer and verdict.
    lines = (out / "completions.jsonl").read_text().splitlines()
    saved = [json.loads(line) for line in lines]
    assert [(e["benchmark"], e["id"]) for e in saved] == [("math500", s["id"]) for s in samples]
    statuses = collections.Counter()
    for entry, row, record in zip(saved, math500, samples, strict=False):
        assert entry["problem"] == row["problem"] and entry["answer"] == row["answer"]
        assert row["problem"] in entry["prompt"]
        assert len(entry["completions"]) == NUM_SAMPLES
        assert [c["status"] for c in entry["completions"]] == record["statuses"]
        assert [c["length"] for c in entry["completions"]] == record["lengths"]
        for completion in entry["completions"]:
            assert completion["text"] and isinstance(completion["text"], str)
            assert completion["extracted_answer"] == rewards.extract_answer(completion["text"])
            statuses[completion["status"]] += 1
    assert {s: statuses[s] for s in rewards.STATUSES} == {s: grader[s] for s in rewards.STATUSES}


@pytest.mark.slow
def test_two_processes_write_what_one_process_writes(policy_dir, data_dir, math_eval, tmp_path):
    """`--num_processes=2`: each process samples and grades its batches, process 0 writes the
    files and prints the report; they equal a single process's (each process's first device is
    a CPU, as the single process's)."""
    out = tmp_path / "two"
    port = free_port()
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    processes = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "experiments.evaluate",
                *_math_flags(policy_dir, data_dir, out),
                f"--coordinator_address=localhost:{port}",
                "--num_processes=2",
                f"--process_id={index}",
            ],
            cwd=REPO_ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )  # fmt: skip
        for index in range(2)
    ]
    try:
        outputs = [process.communicate(timeout=600) for process in processes]
    finally:
        for process in processes:
            stop(process)
    for process, (_, stderr) in zip(processes, outputs, strict=True):
        assert process.returncode == 0, stderr[-3000:]
    single, printed = math_eval
    assert f"| math500 | {NUM_PROBLEMS} |" in outputs[0][0]
    assert "math500" not in outputs[1][0]  # process 1 prints no report (gloo's lines aside)
    for name in ("settings.json", "samples.jsonl", "completions.jsonl"):
        assert (out / name).read_bytes() == (single / name).read_bytes(), name
    assert _without_timing(out / "report.json") == _without_timing(single / "report.json")


@pytest.fixture(scope="module")
def chain_evaluation(chain_run, tmp_path_factory):
    out = tmp_path_factory.mktemp("chain_eval") / "eval"
    printed = _evaluate([f"--policy={chain_run}", f"--out={out}"]).stdout
    return out, printed


@pytest.mark.slow
def test_a_chain_run_is_evaluated_on_its_test_split(chain_run, chain_evaluation):
    out, printed = chain_evaluation
    config = json.loads((chain_run / "config.json").read_text())
    test = tasks.build_splits(tasks.ChainTaskConfig(**config["task"])).test
    report = json.loads((out / "report.json").read_text())
    assert report["task"] == "chain"
    assert report["settings"]["split"] == "test" and report["settings"]["step"] == 2
    # It ends by naming its folder and main files in words, not a Python list.
    ending = printed.rstrip().splitlines()
    start = ending.index(f"Wrote {out}/:")
    assert [line.split()[0] for line in ending[start + 1 : start + 4]] == [
        "report.md",
        "report.json",
        "completions.jsonl",
    ]
    assert "['" not in printed
    assert report["settings"]["policy"] == str(chain_run)
    assert report["settings"]["temperature"] == 1.0 and report["num_samples"] == 8
    assert [p["id"] for p in report["problems"]] == [row["id"] for row in test]
    levels = sorted({row["level"] for row in test})
    assert [int(level) for level in report["levels"]] == levels
    per_level = config["task"]["test_per_level"]
    assert all(s["num_problems"] == per_level for s in report["levels"].values())
    assert report["pooled"]["num_problems"] == len(test)
    # The frontier: the levels whose pass@8 is below 0.95, and their problems pooled.
    frontier = [int(lv) for lv, s in report["levels"].items() if s["pass@k"]["8"] < 0.95]
    assert report["frontier"]["levels"] == frontier and report["frontier"]["k"] == 8
    assert report["frontier"]["summary"]["num_problems"] == per_level * len(frontier)
    markdown = (out / "report.md").read_text()
    assert "| level | problems | pass@1 | pass@8 |" in markdown
    assert all(f"\n| {level} | {per_level} |" in markdown for level in levels)
    assert f"| pooled | {len(test)} |" in markdown and "| frontier |" in markdown
    assert f"Frontier levels (pass@8 < 0.95): {', '.join(map(str, frontier))}." in markdown
    assert markdown in printed

    saved = [json.loads(line) for line in (out / "completions.jsonl").read_text().splitlines()]
    assert [(e["id"], e["prompt"], e["solution"]) for e in saved] == [
        (row["id"], row["prompt"], row["solution"]) for row in test
    ]
    for entry, problem in zip(saved, report["problems"], strict=True):
        assert len(entry["completions"]) == 8
        assert sum(c["correct"] for c in entry["completions"]) == problem["c"]
        for completion in entry["completions"]:
            grade = tasks.grade_text(completion["text"], entry["solution"])
            assert grade == completion["correct"], completion


@pytest.mark.slow
def test_the_model_folder_gives_the_same_evaluation(chain_run, chain_evaluation, tmp_path):
    out, _ = chain_evaluation
    report = evaluation.evaluate_policy(chain_run / "model", tmp_path / "eval", progress=False)
    assert isinstance(report, evaluation.ChainReport) and report.settings["step"] is None
    assert (tmp_path / "eval" / "completions.jsonl").read_bytes() == (
        out / "completions.jsonl"
    ).read_bytes()
    saved = json.loads((out / "report.json").read_text())
    assert report.to_dict()["levels"] == saved["levels"]


@pytest.mark.parametrize(
    "case, message",
    [
        ("unknown_benchmark", "unknown benchmark 'gsm8k'; known: math500, aime24"),
        ("empty_folder", "is not a model folder (no config.json) nor a training work directory"),
        pytest.param(  # trains a chain run first: the slow tier
            "chain_tokenizer",
            "has the chain task's 18-symbol tokenizer but no run config",
            marks=pytest.mark.slow,
        ),
    ],
)
def test_a_refusal_is_one_line_and_leaves_out_untouched(
    case, message, policy_dir, tmp_path, request
):
    out = tmp_path / "out"
    policy = {"unknown_benchmark": policy_dir, "empty_folder": tmp_path / "empty"}.get(case)
    if case == "empty_folder":
        policy.mkdir()
        out.mkdir()  # an existing folder stays as it was
        (out / "notes.txt").write_text("mine")
    if case == "chain_tokenizer":
        # The final policy copied away from its run: today's "Missing [UNK] token" failure.
        model = request.getfixturevalue("chain_run") / "model"
        policy = shutil.copytree(model, tmp_path / "lonely")
    before = _snapshot(out)
    flags = ["--benchmarks=math500,gsm8k"] if case == "unknown_benchmark" else []
    completed = _evaluate([f"--policy={policy}", f"--out={out}", *flags], status=2)
    assert completed.stderr.startswith("error: ") and message in completed.stderr
    assert len(completed.stderr.strip().splitlines()) == 1, completed.stderr
    assert _snapshot(out) == before


def test_missing_required_flag_is_one_line(tmp_path):
    completed = _evaluate([f"--out={tmp_path / 'out'}"], status=2)
    assert "--policy is missing" in completed.stderr
    assert len(completed.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "out").exists()


def test_open_policy_errors(policy_dir, tmp_path):
    with pytest.raises(FileNotFoundError, match="is not a folder"):
        evaluation.open_policy(tmp_path / "absent")
    with pytest.raises(FileNotFoundError, match="no config.json"):
        evaluation.open_policy(tmp_path)
    no_tokenizer = tmp_path / "no_tokenizer"
    no_tokenizer.mkdir()
    for name in ("config.json", "model.safetensors"):
        (no_tokenizer / name).write_bytes((policy_dir / name).read_bytes())
    with pytest.raises(FileNotFoundError, match="has no tokenizer"):
        evaluation.open_policy(no_tokenizer)
    (no_tokenizer / "model.safetensors").unlink()
    with pytest.raises(FileNotFoundError, match="no \\*.safetensors"):
        evaluation.open_policy(no_tokenizer)
    opened = evaluation.open_policy(policy_dir, dtype="float32")
    assert opened.task_kind == "math" and opened.model.config.vocab_size == len(opened.tokenizer)


def test_auto_dtype_is_float32_on_cpu_and_bfloat16_on_accelerators(policy_dir, monkeypatch):
    assert jax.default_backend() == "cpu"
    assert evaluation.resolve_dtype("auto") == "float32"
    model = evaluation.open_policy(policy_dir).model
    dtypes = {leaf.dtype for leaf in jax.tree.leaves(nnx.state(model, nnx.Param))}
    assert dtypes == {jnp.dtype(jnp.float32)}
    for backend in ("gpu", "tpu"):
        monkeypatch.setattr(jax, "default_backend", lambda backend=backend: backend)
        assert evaluation.resolve_dtype("auto") == "bfloat16"
    assert evaluation.resolve_dtype("float32") == "float32"
    with pytest.raises(ValueError, match="dtype=.float16."):
        evaluation.resolve_dtype("float16")
