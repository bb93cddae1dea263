"""What a person sees in a terminal when a run is interrupted and resumed.

`experiments.train` runs in a pseudo-terminal (pexpect) with its progress bar. Ctrl-C (the
terminal's interrupt character, as a person sends it) arrives mid-run; the screen, rendered as a
terminal would (a carriage return moves to the start of the line, text overwrites), must show:
the notice on a line of its own, never inside a bar line; the bar, the notice, the stop line and
the checkpoint at the same step; the last line saying how to resume (the same command). The same
command then says in one line before its bar that it resumes, from which step, of how many, from
which checkpoint, and its bar says "compiling (first step)..." until that step is done; raising
`--config.steps` says that it extends the finished run.
"""

import os
import re
import shlex
import signal
import sys
from pathlib import Path

import pytest

from gdro_jax import runtime

pexpect = pytest.importorskip("pexpect")

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[1]
STEPS = 30
BAR = re.compile(rf"\|\s*(\d+)/{STEPS} \[")
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def _command(workdir, steps=STEPS):
    return [
        "python", "-m", "experiments.train", "--config=experiments/configs/tiny_cpu.py",
        f"--workdir={workdir}", f"--config.steps={steps}", "--config.num_prompts=4",
        "--config.n_mean=2", "--config.max_new_tokens=16", "--config.model.num_layers=1",
        "--config.task.pool_size=32", "--config.checkpoint.every_steps=100",
        "--config.tensorboard=False",
    ]  # fmt: skip


def _spawn(command):
    return pexpect.spawn(
        sys.executable,
        command[1:],
        cwd=str(ROOT),
        env=dict(os.environ, JAX_PLATFORMS="cpu", COLUMNS="120"),
        dimensions=(40, 120),
        encoding="utf-8",
        timeout=400,
    )


def render(raw: str) -> list[str]:
    """The lines a terminal shows for `raw`: `\\r` returns to the line's start and later text
    overwrites earlier text; escape sequences (colours, cursor moves) are dropped."""
    lines, line, column = [], [], 0
    for char in ANSI.sub("", raw):
        if char == "\n":
            lines.append("".join(line).rstrip())
            line, column = [], 0
        elif char == "\r":
            column = 0
        else:
            if column < len(line):
                line[column] = char
            else:
                line.append(char)
            column += 1
    if line:
        lines.append("".join(line).rstrip())
    return lines


def _finish(child) -> tuple[int | None, list[str]]:
    status, raw = _finish_raw(child)
    return status, render(raw)


def _finish_raw(child) -> tuple[int | None, str]:
    child.expect(pexpect.EOF)
    raw = child.before
    child.close()
    return child.exitstatus, raw


def _screen_of_an_interrupted_run(workdir):
    child = _spawn(_command(workdir))
    child.expect(rf" [3-9]/{STEPS} \[")  # a few steps done, the bar on screen
    shown = child.before + child.after
    child.sendintr()  # Ctrl-C, through the terminal
    status, rest = _finish_raw(child)
    return status, render(shown + rest)


def test_ctrl_c_then_the_same_command_resumes_and_the_screen_says_so(tmp_path):
    workdir = tmp_path / "run"
    status, lines = _screen_of_an_interrupted_run(workdir)
    screen = "\n".join(lines)
    assert status == 128 + signal.SIGINT, screen[-3000:]

    # The notice is a line of its own, never glued to a bar line.
    for line in lines:
        assert not (BAR.search(line) and "SIGINT" in line), line
    notices = [line for line in lines if line.startswith("SIGINT received: finishing step ")]
    assert len(notices) == 1, screen[-3000:]
    step = int(re.match(r"SIGINT received: finishing step (\d+) ", notices[0])[1])
    # The stop line, the checkpoint and the bar's last state agree on that step.
    stop = f"SIGINT: stopped after step {step} of {STEPS}; checkpoint saved in "
    stops = [line for line in lines if line.startswith(stop)]
    assert stops == [stop + str(workdir / "checkpoints" / str(step))], screen[-3000:]
    assert (workdir / "checkpoints" / str(step)).is_dir()
    bars = [int(BAR.search(line)[1]) for line in lines if BAR.search(line)]
    assert bars[-1] == step, screen[-3000:]
    # The last line: how to resume, the same command.
    assert lines[-1] == "to resume, run the same command again: " + shlex.join(_command(workdir))

    # The same command: one line before its bar says where it resumes.
    status, raw = _finish_raw(_spawn(_command(workdir)))
    lines = render(raw)
    screen = "\n".join(lines)
    assert status == 0, screen[-3000:]
    first_bar = next(i for i, line in enumerate(lines) if BAR.search(line))
    resumed = [i for i, line in enumerate(lines) if line.startswith("resuming ")]
    assert resumed and resumed[0] < first_bar, screen[-3000:]
    assert lines[resumed[0]] == (
        f"resuming the run in {workdir} from step {step} of {STEPS} "
        f"({workdir / 'checkpoints' / str(step)})"
    )
    assert int(BAR.search(ANSI.sub("", raw))[1]) == step  # the bar's first drawing
    # Until its first step is done, the bar says that the step compiles; never after.
    drawings = [d for d in re.split(r"[\r\n]", ANSI.sub("", raw)) if BAR.search(d)]
    noted = [int(BAR.search(d)[1]) for d in drawings if runtime.COMPILING_NOTE in d]
    assert noted and set(noted) == {step}, drawings[:4]
    assert [int(BAR.search(line)[1]) for line in lines if BAR.search(line)][-1] == STEPS

    # Raising the steps of the finished run: it says that it extends it.
    status, lines = _finish(_spawn(_command(workdir, steps=STEPS + 2)))
    assert status == 0, "\n".join(lines)[-3000:]
    assert (
        f"extending the finished run in {workdir} from {STEPS} to {STEPS + 2} steps "
        f"(checkpoint {workdir / 'checkpoints' / str(STEPS)})"
    ) in lines


def test_render_overwrites_like_a_terminal():
    bar = "grpo:  10%| 3/30 ["
    cleared = "\r" + " " * len(bar) + "\r"
    assert render(bar + cleared + "notice\r\nbar 4/30") == ["notice", "bar 4/30"]
    assert render("grpo: 3/30 [00:01]notice\n") == ["grpo: 3/30 [00:01]notice"]
