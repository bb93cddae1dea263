"""User errors at the command line: one line naming the flag and the fix, before any side effect.

Each case runs a real entry point in a subprocess and asserts its exit status 2, a single-line
message on stderr without a traceback, and that the work directory was not created (or, for a
file given as the work directory, left byte for byte as it was).
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests._folders import read_only, tree

REPO_ROOT = Path(__file__).resolve().parents[1]
TRAIN = ("experiments.train", "--config=experiments/configs/tiny_cpu.py")
SIM = ("experiments.simulate_controllers", "--config=experiments/configs/sim_tiny.py")


def _run(module, *argv, env=None):
    return subprocess.run(
        [sys.executable, "-m", module, *argv],
        cwd=REPO_ROOT,
        env=dict(os.environ, JAX_PLATFORMS="cpu", **(env or {})),
        capture_output=True,
        text=True,
        timeout=300,
    )


def _one_line_error(completed, *fragments):
    assert completed.returncode == 2, completed.stderr[-2000:]
    lines = [line for line in completed.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, completed.stderr[-2000:]
    assert lines[0].startswith("error: ") and "Traceback" not in completed.stderr
    for fragment in fragments:
        assert fragment in lines[0], lines[0]


@pytest.mark.parametrize(
    ("argv", "fragments"),
    [
        ((*TRAIN, "--config.method=foo"), ("config.method", "'foo'", "gdro_both")),
        ((*SIM, "--config.methods=foo"), ("methods", "'foo'", "grpo")),
        (("experiments.train", "--config=experiments/configs/nope.py"), ("nope.py", "no such")),
        (
            (*TRAIN, "--config.modle.compute_dtype=bfloat16"),
            ("--config.modle.compute_dtype", "no field 'modle'", "did you mean model?"),
        ),
        (
            (*TRAIN, "--config.grpo.eps_hi=0.3"),
            ("config.grpo has no field 'eps_hi'", "eps_high"),
        ),
        ((*SIM, "--config.prompt_gdro.etaa=1.0"), ("no field 'etaa'", "did you mean eta?")),
        ((*TRAIN, "--config.steps.more=3"), ("config.steps is a value, not a block",)),
        ((*TRAIN, "--config.steps=abc"), ("--config.steps=abc", "int", "--help")),
        ((*TRAIN, "--bogus=1"), ("Unknown command line flag 'bogus'", "--help")),
        (("experiments.train",), ("--config is missing", "--config=experiments/configs/")),
        # Without the extra it names the extra; with it, tiny_cpu's head width of 16.
        ((*TRAIN, "--config.rollout.engine=vllm"), ("config.rollout.engine='vllm'",)),
    ],
    ids=[
        "unknown-method",
        "unknown-sim-method",
        "missing-config-file",
        "misspelt-block",
        "misspelt-field",
        "misspelt-sim-field",
        "field-of-a-value",
        "a-value-of-the-wrong-type",
        "unknown-flag",
        "missing-config",
        "vllm-engine",
    ],
)
def test_a_refused_command_writes_nothing(tmp_path, argv, fragments):
    workdir = tmp_path / "run"
    completed = _run(argv[0], *argv[1:], f"--workdir={workdir}")
    _one_line_error(completed, *fragments)
    assert not workdir.exists()


# Every entry point without its required output flag (the others given): one line naming the
# flag, its help and an example value, status 2.
MISSING_OUTPUT = {
    "experiments.train": (TRAIN[1], "--workdir"),
    "experiments.pretrain": ("--config=experiments/configs/pretrain_tiny.py", "--workdir"),
    "experiments.compare": ("--config=experiments/configs/study.py", "--workdir"),
    "experiments.demo": ("--config=experiments/configs/demo.py", "--workdir"),
    "experiments.simulate_controllers": (SIM[1], "--workdir"),
    "experiments.simulate_study": ("--config=experiments/configs/sim_study.py", "--workdir"),
    "experiments.evaluate": ("--policy=runs/grpo", "--out"),
    "experiments.plan": ("", "--config"),
    "experiments.premise": ("--profiles=cliff --warm_starts=a --pilots=b", "--out"),
}


# The message is experiments._cli's, pinned in `make test` by train; each other entry point's
# wiring of it runs in `make test-slow` (as their `--help`, tests/test_cli_help.py).
@pytest.mark.parametrize(
    "module",
    [
        module if module == TRAIN[0] else pytest.param(module, marks=pytest.mark.slow)
        for module in sorted(MISSING_OUTPUT)
    ],
)
def test_a_missing_required_flag_is_one_line_with_an_example(module):
    given, missing = MISSING_OUTPUT[module]
    completed = _run(module, *given.split())
    _one_line_error(completed, f"{missing} is missing", f"e.g. {missing}=")


@pytest.mark.parametrize("argv", [TRAIN, SIM], ids=["train", "simulate"])
def test_a_workdir_that_is_a_file_is_refused_and_left_alone(tmp_path, argv):
    workdir = tmp_path / "notes.txt"
    workdir.write_text("mine\n")
    completed = _run(argv[0], *argv[1:], f"--workdir={workdir}")
    _one_line_error(completed, "--workdir=", "is a file")
    assert workdir.read_text() == "mine\n"


@pytest.mark.slow
def test_a_field_the_shipped_config_did_not_spell_out_is_overridden(tmp_path):
    """`tiny_cpu.py` holds every field of the run schema, so the README's bfloat16 override runs
    (a 1-layer model, 4 prompts, one step)."""
    workdir = tmp_path / "run"
    completed = _run(
        *TRAIN, f"--workdir={workdir}", "--config.model.compute_dtype=bfloat16",
        "--config.steps=1", "--config.num_prompts=4", "--config.n_mean=2",
        "--config.max_new_tokens=8", "--config.model.num_layers=1", "--config.task.pool_size=16",
        "--config.progress=False",
    )  # fmt: skip
    assert completed.returncode == 0, completed.stderr[-3000:]
    saved = json.loads((workdir / "config.json").read_text())
    assert saved["model"]["compute_dtype"] == "bfloat16"
    assert json.loads((workdir / "model" / "config.json").read_text())["num_hidden_layers"] == 1


def test_debug_variable_brings_the_traceback_back(tmp_path):
    completed = _run(*TRAIN, "--config.method=foo", f"--workdir={tmp_path / 'run'}",
                     env={"GDRO_DEBUG": "1"})  # fmt: skip
    assert completed.returncode != 0
    assert "Traceback" in completed.stderr and "config.method" in completed.stderr
    assert not (tmp_path / "run").exists()


def test_at_most_one_test_module_imports_an_entry_point():
    """pytest imports every test module into each worker, and every entry point defines absl
    flags (`--config`, `--workdir`) at import: two entry points imported by tests clash with
    DuplicateFlagError at collection. Tests reach the others through a subprocess or the library
    function they wrap."""
    entry_points = {
        path.stem
        for path in (REPO_ROOT / "experiments").glob("*.py")
        if "DEFINE_" in path.read_text() or "define_process_flags()" in path.read_text()
    }
    imported = {}
    for test in (REPO_ROOT / "tests").rglob("test_*.py"):
        for line in test.read_text().splitlines():
            words = line.replace(",", " ").split()
            if line.startswith("from experiments import "):
                names = words[3:]
            elif line.startswith("import experiments."):
                names = [words[1].split(".")[1]]
            else:
                continue
            for name in set(names) & entry_points:
                imported.setdefault(name, []).append(str(test.relative_to(REPO_ROOT)))
    assert len(imported) <= 1, imported


# Environment errors, before any work (issue 38): a folder that cannot be written, a config
# file that does not load. Each leaves every file already there byte for byte as it was.
EVALUATE = ("experiments.evaluate", "--policy=runs/grpo")


def _refused_and_left_alone(tmp_path, argv, *fragments, env=None):
    before = tree(tmp_path)
    completed = _run(argv[0], *argv[1:], env=env)
    _one_line_error(completed, *fragments)
    assert tree(tmp_path) == before


@pytest.mark.parametrize("argv", [TRAIN, EVALUATE], ids=["train-workdir", "evaluate-out"])
def test_a_read_only_output_folder_is_refused_before_any_work(tmp_path, argv):
    """Planted: the command line's writability check removed (train: a PermissionError once
    the run writes its first checkpoint; evaluate: the library's own check, naming out_dir and
    not the flag)."""
    folder = tmp_path / "shared"
    folder.mkdir()
    (folder / "notes.txt").write_text("mine\n")
    flag = "--workdir" if argv is TRAIN else "--out"
    with read_only(folder):
        _refused_and_left_alone(
            tmp_path, (*argv, f"{flag}={folder}"), f"{flag}={folder}", "cannot write in", "writable"
        )


def test_a_workdir_under_a_file_is_refused_before_any_work(tmp_path):
    """Runs as any user, root included: no folder can be made under a regular file. (--out is
    the same check; evaluate_policy's own is tested in tests/eval/test_chain.py.)"""
    (tmp_path / "notes.txt").write_text("mine\n")
    given = tmp_path / "notes.txt" / "run"
    _refused_and_left_alone(
        tmp_path, (*TRAIN, f"--workdir={given}"), f"--workdir={given}", "notes.txt is a file"
    )


BROKEN_CONFIGS = {
    "no-get_config": ("import ml_collections\nCONFIG = ml_collections.ConfigDict()\n",
                      ("defines no get_config()", "experiments/configs/tiny_cpu.py")),
    "syntax-error": ("def get_config(:\n    pass\n", ("line 1", "fix the file's syntax")),
}  # fmt: skip


@pytest.mark.parametrize("case", sorted(BROKEN_CONFIGS))
def test_a_config_file_that_does_not_load_is_one_line(tmp_path, case):
    """Planted: the load check removed (absl's chained traceback, exit 1)."""
    text, fragments = BROKEN_CONFIGS[case]
    config = tmp_path / "mine.py"
    config.write_text(text)
    argv = ("experiments.train", f"--config={config}", f"--workdir={tmp_path / 'run'}")
    _refused_and_left_alone(tmp_path, argv, f"--config={config}", *fragments)


def test_debug_variable_shows_a_broken_config_files_traceback(tmp_path):
    config = tmp_path / "mine.py"
    config.write_text(BROKEN_CONFIGS["syntax-error"][0])
    completed = _run("experiments.train", f"--config={config}", f"--workdir={tmp_path / 'run'}",
                     env={"GDRO_DEBUG": "1"})  # fmt: skip
    assert completed.returncode != 0
    assert "Traceback" in completed.stderr and "SyntaxError" in completed.stderr
    assert not (tmp_path / "run").exists()


def test_debug_variable_set_to_0_leaves_the_one_line(tmp_path):
    """Planted: any value of GDRO_DEBUG counted as on (`0` printed the traceback)."""
    config = tmp_path / "mine.py"
    config.write_text(BROKEN_CONFIGS["syntax-error"][0])
    completed = _run("experiments.train", f"--config={config}", f"--workdir={tmp_path / 'run'}",
                     env={"GDRO_DEBUG": "0"})  # fmt: skip
    _one_line_error(completed, f"--config={config}", "line 1")
