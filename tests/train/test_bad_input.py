"""Bad input at the trainer's boundary fails with a message naming it, and loses nothing.

A run of 2 steps (a checkpoint after each) is written once; every bad-input case then calls
`train` on a copy of that workdir, asserts the error's message, and asserts that every file the
first run wrote (checkpoints, metrics, config, summary, policy) is byte-identical afterwards.
The math cases do the same with a 1-step DAPO-Math run whose data file is then damaged.
"""

import dataclasses
import json
import pathlib
import shutil
import time

import jax.numpy as jnp
import numpy as np
import pytest

from experiments.configs import paper_qwen3_1p7b
from gdro_jax import data, models, train
from gdro_jax.train import RewardError
from tests.train.configs import small_run_config

DAPO_FILE = "dapo_math_17k_en_dedup.jsonl"


def _config(steps=2):
    return small_run_config(steps=steps, **{"checkpoint.every_steps": 1, "checkpoint.keep": 3})


def _snapshot(folder: pathlib.Path) -> dict[str, bytes]:
    return {
        str(path.relative_to(folder)): path.read_bytes()
        for path in sorted(folder.rglob("*"))
        if path.is_file() and "tb" not in path.relative_to(folder).parts
    }


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("run") / "work"
    train.train(_config(), workdir)
    return workdir


@pytest.fixture
def workdir(finished, tmp_path):
    copy = tmp_path / "work"
    shutil.copytree(finished, copy)
    return copy


def _fails_and_keeps(workdir, error, message, config, **hooks):
    before = _snapshot(workdir)
    assert any(name.startswith("checkpoints/") for name in before)
    assert (workdir / "metrics.jsonl").read_text().count("\n") == 2
    with pytest.raises(error, match=message):
        train.train(config, workdir, **hooks)
    after = _snapshot(workdir)
    for name, content in before.items():
        if name == "config.json" and after.get(name) != content:
            # A resume records its config; only resumable fields may differ.
            saved, now = json.loads(content), json.loads(after[name])
            resumable = {"steps": None, "reward_timeout_s": None}
            assert {**saved, **resumable} == {**now, **resumable}
            continue
        assert after.get(name) == content, f"{name} was lost or altered"


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"method": "rollout_gdro", "n_mean": 1}, r"rollout budget is infeasible"),
        ({"classifier.edges": (0.6, 0.3)}, r"config.classifier.edges must be strictly ascending"),
        ({"num_prompts": 3, "n_mean": 3, "mesh.data": 2}, r"must divide evenly over the mesh"),
        ({"mesh.fsdp": 16}, r"config.mesh .* = 16 devices, but only 8 are available"),
    ],
)
def test_a_config_that_cannot_work_loses_nothing(workdir, overrides, message):
    config = _config(steps=4)
    for name, value in overrides.items():
        target = config
        *path, last = name.split(".")
        for part in path:
            target = target[part]
        target[last] = value
    _fails_and_keeps(workdir, ValueError, message, config)


def _raises_at_step_3(ids, tokens, lengths, slots):
    raise ConnectionError("grading service unreachable")


def _nan_reward(ids, tokens, lengths, slots):
    rewards = jnp.where(jnp.arange(lengths.shape[0]) == 1, jnp.nan, -1.0)
    return rewards, rewards > 0


def _hangs(ids, tokens, lengths, slots):
    time.sleep(3.0)
    return np.full(len(lengths), -1.0, np.float32), np.zeros(len(lengths), bool)


@pytest.mark.parametrize(
    ("hooks", "timeout", "message"),
    [
        (
            {"host_reward_fn": _raises_at_step_3},
            0.0,
            r"step 3: reward function host_reward_fn .* raised ConnectionError",
        ),
        ({"reward_fn": _nan_reward}, 0.0, r"step 3: .* non-finite rewards for 1 of 8 rollouts"),
        ({"host_reward_fn": _hangs}, 0.5, r"step 3: .* did not return within 0.5 s"),
    ],
)
def test_a_reward_that_misbehaves_on_resume_loses_nothing(workdir, hooks, timeout, message):
    config = _config(steps=4)
    config.reward_timeout_s = timeout
    _fails_and_keeps(workdir, RewardError, message, config, **hooks)


# ------------------------------------------------------------------ math: data and prompts


@pytest.fixture(scope="module")
def math_finished(data_dir, tmp_path_factory):
    """One DAPO-Math step (8 prompts, a tiny random Qwen3, a tokenizer trained here)."""
    rows = data.load_preset("dapo_math_en", data_dir)
    tokenizer_dir = tmp_path_factory.mktemp("tokenizer")
    tokenizer = data.build_tokenizer([r["prompt"] for r in rows[:200]], path=tokenizer_dir)
    config = paper_qwen3_1p7b.get_config()
    config.update(
        steps=1,
        progress=False,
        tensorboard=False,
        num_prompts=8,
        n_mean=2,
        max_new_tokens=8,
        tokenizer=str(tokenizer_dir),
    )
    config.math.update(data_dir=str(data_dir), limit=8, max_prompt_tokens=4096, grader_workers=1)
    tiny = models.DecoderConfig.tiny(vocab_size=len(tokenizer), max_position_embeddings=4096)
    config.model = dataclasses.asdict(tiny)
    config.mesh.update(data=1, fsdp=1, tensor=1)
    config.checkpoint.update(every_steps=1, keep=2)
    workdir = tmp_path_factory.mktemp("math") / "work"
    train.train(config, workdir)
    return config, workdir


def _damaged_data_dir(data_dir, tmp_path, damage):
    """A copy of the DAPO-Math file with line 3 damaged."""
    folder = tmp_path / "data"
    folder.mkdir()
    lines = (data_dir / DAPO_FILE).read_bytes().split(b"\n")
    row = json.loads(lines[2])
    if damage == "missing_answer":
        del row["answer"]
        lines[2] = json.dumps(row).encode()
    elif damage == "empty_answer":
        row["answer"] = ""
        lines[2] = json.dumps(row).encode()
    elif damage == "bad_json":
        lines[2] = lines[2][:-5]
    elif damage == "not_utf8":
        lines[2] = lines[2].replace(b'"problem": "', b'"problem": "\xff\xfe', 1)
    elif damage == "duplicate_id":
        lines[2] = json.dumps(dict(row, id=json.loads(lines[0])["id"])).encode()
    elif damage == "empty":
        lines = []
    (folder / DAPO_FILE).write_bytes(b"\n".join(lines))
    return folder


@pytest.mark.slow
@pytest.mark.parametrize(
    ("damage", "message"),
    [
        ("missing_answer", rf"{DAPO_FILE}:line 3: .*answer"),
        ("empty_answer", rf"{DAPO_FILE}:line 3: .*answer"),
        ("bad_json", rf"{DAPO_FILE}:line 3: "),
        ("not_utf8", rf"{DAPO_FILE}:line 3: .*UTF-8"),
        ("duplicate_id", rf"{DAPO_FILE}:line 3: .*duplicate"),
        ("empty", rf"{DAPO_FILE}: the dataset has no rows"),
    ],
)
def test_a_damaged_dataset_on_resume_is_named_and_loses_nothing(
    math_finished, data_dir, tmp_path, damage, message
):
    config, finished_dir = math_finished
    workdir = tmp_path / "work"
    shutil.copytree(finished_dir, workdir)
    config = config.copy_and_resolve_references()
    config.steps = 2
    config.math.data_dir = str(_damaged_data_dir(data_dir, tmp_path, damage))
    before = _snapshot(workdir)
    with pytest.raises(data.DataFormatError, match=message):
        train.train(config, workdir)
    assert _snapshot(workdir) == before


@pytest.mark.slow
def test_a_prompt_over_the_limit_raises_by_row_when_asked(math_finished, tmp_path):
    config, _ = math_finished
    config = config.copy_and_resolve_references()
    config.math.update(max_prompt_tokens=40, on_long_prompt="raise")
    workdir = tmp_path / "fresh"
    workdir.mkdir()
    (workdir / "notes.txt").write_text("mine")
    with pytest.raises(
        ValueError, match=r"row 0 \(id='.*'\) has a prompt of \d+ tokens, more than"
    ):
        train.train(config, workdir)
    assert _snapshot(workdir) == {"notes.txt": b"mine"}
