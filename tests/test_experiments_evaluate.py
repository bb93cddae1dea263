"""`experiments/evaluate.py` end to end: a tiny random Qwen3 with a tokenizer trained in the test,
10 MATH500 problems, 2 samples each; and `load_policy`'s errors for folders that are not
policies.

The entry point runs as a subprocess: parsing absl flags in this process would also run the
required-flag validators of the other entry points that tests import.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gdro_jax import data, models
from gdro_jax import eval as evaluation

NUM_PROBLEMS = 10
NUM_SAMPLES = 2


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


REPO_ROOT = Path(__file__).resolve().parents[1]


def _run(argv):
    environment = dict(os.environ, JAX_PLATFORMS="cpu")
    completed = subprocess.run(
        [sys.executable, "-m", "experiments.evaluate", *argv],
        cwd=REPO_ROOT,
        env=environment,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert completed.returncode == 0, completed.stderr[-3000:]
    return completed.stdout


def test_main_writes_the_report(policy_dir, data_dir, math500, tmp_path):
    out = tmp_path / "eval"
    printed = _run(
        [
            f"--policy={policy_dir}",
            f"--out={out}",
            "--benchmarks=math500",
            f"--data_dir={data_dir}",
            f"--limit={NUM_PROBLEMS}",
            f"--num_samples={NUM_SAMPLES}",
            "--max_new_tokens=16",
            "--batch_size=5",
            "--num_workers=1",
            "--dtype=float32",
        ]
    )
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
    assert "| bin | problems | mean@2 | pass@1 | pass@2 |" in markdown
    assert markdown in printed
    assert len((out / "samples.jsonl").read_text().splitlines()) == NUM_PROBLEMS


def test_load_policy_errors(policy_dir, tmp_path):
    with pytest.raises(FileNotFoundError, match="is not a folder"):
        evaluation.load_policy(tmp_path / "absent")
    with pytest.raises(FileNotFoundError, match="no config.json"):
        evaluation.load_policy(tmp_path)
    no_tokenizer = tmp_path / "no_tokenizer"
    no_tokenizer.mkdir()
    for name in ("config.json", "model.safetensors"):
        (no_tokenizer / name).write_bytes((policy_dir / name).read_bytes())
    with pytest.raises(FileNotFoundError, match="has no tokenizer"):
        evaluation.load_policy(no_tokenizer)
    (no_tokenizer / "model.safetensors").unlink()
    with pytest.raises(FileNotFoundError, match="no \\*.safetensors"):
        evaluation.load_policy(no_tokenizer)
    model, tokenizer = evaluation.load_policy(policy_dir, dtype="float32")
    assert model.config.vocab_size == len(tokenizer)


def test_missing_required_flag_is_a_usage_error(tmp_path):
    completed = subprocess.run(
        [sys.executable, "-m", "experiments.evaluate", f"--out={tmp_path}"],
        cwd=REPO_ROOT,
        env=dict(os.environ, JAX_PLATFORMS="cpu"),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert completed.returncode != 0
    assert "--policy is required" in completed.stderr
