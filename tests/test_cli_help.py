"""`--help` of every entry point, as a person reads it: exit status 0, a usage line with a real
example, the entry point's own flags, and the config's fields with their defaults and help,
without the flags of the libraries (absltest's, chex's, grain's: `--helpfull` keeps those).

Each case runs the real command in a subprocess.
"""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from experiments.configs import tiny_cpu
from gdro_jax import controllers

ROOT = Path(__file__).resolve().parents[1]
ENTRY_POINTS = (
    "compare",
    "demo",
    "evaluate",
    "plan",
    "plot_run",
    "premise",
    "pretrain",
    "run_notebooks",
    "simulate_controllers",
    "simulate_study",
    "train",
)
# Flags of the libraries an entry point imports (absltest through chex, grain's own).
FOREIGN = ("--test_srcdir", "--test_tmpdir", "--xml_output_file", "--chex_", "--grain_")


def _help(module, *argv):
    completed = subprocess.run(
        [sys.executable, "-m", f"experiments.{module}", *argv, "--help"],
        cwd=ROOT,
        env=dict(os.environ, JAX_PLATFORMS="cpu"),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert completed.returncode == 0, completed.stderr[-2000:]
    return completed.stdout


def _leaves(config, prefix=""):
    for name, value in config.items():
        if hasattr(value, "items"):
            yield from _leaves(value, f"{prefix}{name}.")
        else:
            yield f"{prefix}{name}", value


# `train` in `make test`; every other entry point in the slow tier (each a subprocess that
# starts jax).
@pytest.mark.parametrize(
    "module",
    [m if m == "train" else pytest.param(m, marks=pytest.mark.slow) for m in ENTRY_POINTS],
)
def test_help_exits_0_with_a_usage_line_an_example_and_no_library_flags(module):
    text = _help(module)
    lines = text.splitlines()
    assert lines[0].startswith(f"usage: python -m experiments.{module} ")
    assert lines[1].startswith(f"example: python -m experiments.{module} --")
    assert "  " not in lines[1].removeprefix("example: ")  # continuations joined, not collapsed
    for flag in FOREIGN:
        assert flag not in text, flag
    assert "experiments._cli" not in text


def _shown(value):
    """How the help writes a default: strings bare (quoted when empty), tuples `(a,b)`."""
    if isinstance(value, str):
        return repr(value) if not value or " " in value else value
    if isinstance(value, tuple):
        return "(" + ",".join(_shown(v) for v in value) + ("," if len(value) == 1 else "") + ")"
    return str(value)


def _packed(lines):
    """`{block: its packed text}` of the blocks listed `name=default` only."""
    packed, block, parent = {}, None, None
    for line in lines:
        match = re.match(r"^( {2,4})(\w+) \(used with [^)]*\): (.*)$", line)
        if re.match(r"^  \w+:$", line):
            parent = line.strip()[:-1]  # a listed block, which may pack a block of its own
        if match:
            # `  knapsack (used with ...)`, or `    vllm (used with ...)` inside `rollout:`
            block = match[2] if len(match[1]) == 2 else f"{parent}.{match[2]}"
            packed[block] = match[3]
        elif block and line.startswith("      "):
            packed[block] += " " + line.strip()
        else:
            block = None
    return packed


def test_train_help_lists_every_field_of_tiny_cpu_with_its_default_in_a_screenful():
    text = _help("train", "--config=experiments/configs/tiny_cpu.py")
    lines = text.splitlines()
    # One line a field: 122 with grpo.pack_sequences, model.attention; 125 with the vip block,
    # 127 with pilot_commit's, 129 with rollout.lane_halvings, 131 with model.remat_policy and
    # rollout.stop_check_every, 132 with rollout.skip_dead_blocks.
    assert len(lines) <= 132
    assert "the defaults of experiments/configs/tiny_cpu.py" in text
    packed = _packed(lines)
    # tiny_cpu runs GRPO on the chain task with the kv_cache engine
    assert {"knapsack", "vip", "mopps", "math", "rollout.vllm"} <= set(packed)
    described, block = set(), ""
    for line in lines[lines.index(next(x for x in lines if x.startswith("config fields"))) + 1 :]:
        if re.match(r"^  \w+:$", line):
            block = line.strip()[:-1] + "."
        elif re.match(r"^  \w", line):
            block = ""
        if re.match(r"^ {2,4}\w+=", line):
            described.add(block + line.split()[0] if line.startswith("    ") else line.split()[0])
    config = tiny_cpu.get_config()
    for name, value in _leaves(config):
        block, _, field = name.rpartition(".")
        if block in packed:
            assert f"{field}={_shown(value)}" in packed[block].split(), name
        else:
            assert f"{name}={_shown(value)}" in described, name
    assert re.search(rf"^  steps={config.steps} +RL steps", text, re.M)
    # The own flags, and the multi-process ones under a heading that says what they are.
    assert "  --workdir  " in text and "several processes (hosts):" in text


@pytest.mark.parametrize(
    ("module", "argv", "field"),
    [
        ("train", (), "method"),
        pytest.param("plan", (), "method", marks=pytest.mark.slow),
        pytest.param(
            "compare", ("--config=experiments/configs/study.py",), "method", marks=pytest.mark.slow
        ),
        pytest.param(
            "demo", ("--config=experiments/configs/demo.py",), "method", marks=pytest.mark.slow
        ),
    ],
)
def test_the_method_field_lists_its_choices(module, argv, field):
    text = _help(module, *argv)
    lines = text.splitlines()
    at = next(i for i, line in enumerate(lines) if line.strip().startswith(f"{field}="))
    line = lines[at]
    for more in lines[at + 1 :]:  # its help's continuation lines
        if not more.startswith(" " * 20):
            break
        line += " " + more.strip()
    for method in controllers.METHODS:
        assert method in line, (method, line)


def test_helpfull_keeps_absls_full_list():
    completed = subprocess.run(
        [sys.executable, "-m", "experiments.train", "--helpfull"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert "absl.flags:" in completed.stdout + completed.stderr


def test_every_field_help_is_a_whole_phrase():
    """The help of a field is the first sentence of its docstring entry, cut neither inside
    brackets (`(N-1; ...)`, an interval `(0, 1]`) nor at an abbreviation (`e.g.`): the cut
    used to leave `... verl's N-1` and `... (levels 1..L), e.g`."""
    from experiments import _cli
    from gdro_jax import configs

    schemas = {"": configs.run_schema, "pretrain.": configs.pretrain_schema}
    rows = [
        row
        for mounted in (schemas, _cli.STUDY_SCHEMAS, _cli.SIM_SCHEMAS)
        for prefix, schema in mounted.items()
        for row in configs.describe(schema(), prefix)
    ]
    assert len(rows) > 300
    for name, _, text in rows:
        assert text, name
        opened, closed = len(re.findall(r"[(\[]", text)), len(re.findall(r"[)\]]", text))
        assert opened == closed, (name, text)
        assert not re.search(r"\b(e\.g|i\.e|cf)$", text), (name, text)
    helps = {name: text for name, _, text in rows}
    assert helps["grpo.advantage_estimator"] == 'the group std: "sample" (N-1) or "population" (N)'
    assert helps["task.test_per_level"].endswith("one int or one per level")
