"""The documentation's examples run as written: every ```python block and every ```bash command of
README.md and of each page of docs/, in the order of `PAGES` (the README's index).

Python blocks run one after another in one subprocess (one jax import for all), each in a fresh
namespace, as a user would run them: one CPU device, from an empty folder, the repository on the
path. Each ```bash command runs from the repository root with `python` replaced by this
interpreter and `runs/...` folders moved to a temporary folder, which the bash blocks share in
page order, as a reader following the pages would.

A block whose first line is `# needs: ...` (a GPU, the network, a big model) is skipped with that
reason; the reader sees the same line. A block marked `# needs: the data files ...` runs when the
data directory exists (`data.default_data_dir()`). A block whose first line is `# takes: ...`
(over a minute on CPU) runs too when that line states at most `TAKES_MINUTES` minutes ("half a
minute", "about 5 min"), each command given four times the stated time, in page order in
`tests/test_docs_long.py` (a file of its own, so that the other pytest worker takes it); one that
states more or no figure ("hours", "several minutes per run") is skipped with its line.
"""

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import NamedTuple

import pytest

from gdro_jax import data
from tests._subprocesses import xla_flags

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
# The README, then its index of docs/ in order (a page's commands may use an earlier one's runs).
PAGES = ["README.md"] + [
    f"docs/{name}.md"
    for name in (
        "controllers", "models", "tasks-and-data", "training", "engines", "scaling", "checkpoints",
        "evaluation", "studies", "simulation", "integrations", "architecture", "testing",
    )
]  # fmt: skip
DATA_FILES = "needs: the data files"
PYTHON_SECONDS = 900  # all python blocks together
COMMAND_SECONDS = 300  # one shell command (each is under a minute on an idle 2-core machine)
TAKES_MINUTES = 6  # a `# takes:` block stating at most this long runs (all tests here are slow)
_STATED = re.compile(r"takes: (?:about |under )?(half a minute|a minute|(\d+(?:\.\d+)?) min)\b")

_FENCE = re.compile(r"^```(\w*)[ \t]*\n(.*?)^```[ \t]*$", re.MULTILINE | re.DOTALL)
_MARKER = re.compile(r"#\s*((?:needs|takes):\s*\S.*)")
_RUNS = re.compile(r"(^|=)runs(?=/|$)")  # a `runs/...` folder, alone or as a flag's value
_CODE_LINE = re.compile(r"^\s*(python |import \w|from [\w.]+ import )")

# Runs the python blocks given as JSON in argv[1]; writes {line: error or None} to argv[2] after
# each block, so a block that hangs still leaves the results of the ones before it.
_RUNNER = r"""
import json, sys, traceback
blocks, out = json.load(open(sys.argv[1])), sys.argv[2]
results = {}
for block in blocks:
    code = "\n" * (block["line"] - 1) + block["code"]  # tracebacks name the page's lines
    page = block["where"].rsplit(":", 1)[0]
    try:
        exec(compile(code, page, "exec"), {"__name__": "__main__"})
        results[block["where"]] = None
    except BaseException:
        results[block["where"]] = traceback.format_exc()
    with open(out, "w") as file:
        json.dump(results, file)
"""


class Block(NamedTuple):
    language: str  # the fence's info string: "python", "bash", or "" for plain text
    page: str  # the Markdown file, relative to the repository
    line: int  # the page's line of the block's first line of code
    code: str
    skip: str | None  # the block's `# needs:` / `# takes:` line, or None
    minutes: float | None = None  # what a `# takes:` line that runs states

    @property
    def seconds(self) -> float:
        """Each command's time limit."""
        return max(COMMAND_SECONDS, 4 * 60 * self.minutes) if self.minutes else COMMAND_SECONDS

    @property
    def where(self) -> str:
        return f"{self.page}:{self.line}"


def page_blocks(text: str, page: str = "README.md") -> list[Block]:
    """Every fenced block of a Markdown text, with its skip marker if it has one."""
    blocks = []
    for match in _FENCE.finditer(text):
        language, code = match.groups()
        line = text.count("\n", 0, match.start(2)) + 1
        first = code.strip().splitlines()[0] if code.strip() else ""
        marker = _MARKER.fullmatch(first.strip())
        skip = marker[1] if marker else None
        if skip and skip.startswith(DATA_FILES) and data.default_data_dir() is not None:
            skip = None
        minutes = stated_minutes(skip)
        if minutes is not None and minutes <= TAKES_MINUTES:
            skip = None
        else:
            minutes = None
        blocks.append(Block(language, page, line, code, skip, minutes))
    return blocks


def stated_minutes(marker: str | None) -> float | None:
    """The minutes a `takes: ...` line states ("half a minute": 0.5, "about 2 min": 2.0), or
    None for another line or one without a figure ("hours", "several minutes")."""
    match = _STATED.match(marker or "")
    if match is None:
        return None
    return float(match[2]) if match[2] else {"half a minute": 0.5, "a minute": 1.0}[match[1]]


def shell_commands(code: str) -> list[list[str]]:
    """The commands of a bash block as argv lists: `\\` continuations joined, comments dropped."""
    joined = code.replace("\\\n", " ")
    return [argv for line in joined.splitlines() if (argv := shlex.split(line, comments=True))]


def _env() -> dict[str, str]:
    """This process's environment as a user's: one CPU device, no display, the repo importable.

    XLA's backend optimisation level is 1, not the suite's 0 (tests/conftest.py): `make sim`'s
    command runs 300 steps of 128 simulated learners, twice as slow at level 0 (40 s against
    21 s), and level 1 compiles the training commands as fast as level 0. The fusion emitters
    are XLA's default, not `make test`'s older ones (`FAST_TIER_XLA_FLAGS`), with which that command
    takes 15 % longer. Nothing here is compared bit for bit with another process."""
    env = dict(os.environ, JAX_PLATFORMS="cpu", MPLBACKEND="Agg")
    env["XLA_FLAGS"] = xla_flags(
        xla_force_host_platform_device_count=None,
        xla_backend_optimization_level=1,
        xla_cpu_use_fusion_emitters=None,
    )
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    return env


BLOCKS = [
    block
    for page in PAGES
    for block in page_blocks((ROOT / page).read_text(encoding="utf-8"), page)
]
PYTHON_BLOCKS = [b for b in BLOCKS if b.language == "python"]
BASH_BLOCKS = [b for b in BLOCKS if b.language == "bash" and b.minutes is None]
LONG_BASH_BLOCKS = [b for b in BLOCKS if b.language == "bash" and b.minutes is not None]


def run_extra_block(page: str, extra: str, folder: Path) -> subprocess.CompletedProcess:
    """Runs `page`'s one python block marked `# needs: the <extra> extra` (skipped here, where
    that extra is not installed; its own tier calls this) as the blocks here run: a fresh
    interpreter in an empty `folder`, tracebacks naming the page's lines."""
    marker = f"needs: the {extra} extra"
    blocks = [
        b
        for b in page_blocks((ROOT / page).read_text(encoding="utf-8"), page)
        if b.language == "python" and (b.skip or "").startswith(marker)
    ]
    assert len(blocks) == 1, f"{page} has one python example marked `# {marker}`"
    script = folder / "example.py"
    script.write_text("\n" * (blocks[0].line - 1) + blocks[0].code)
    return subprocess.run(
        [sys.executable, str(script)],
        cwd=folder,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )


def _id(block: Block) -> str:
    return f"{Path(block.page).stem}:line{block.line}"


def test_every_page_is_tested_and_in_the_readmes_index():
    """A page of docs/ outside `PAGES` would escape these tests; one the README does not link
    would escape its readers."""
    pages = {f"docs/{path.name}" for path in (ROOT / "docs").glob("*.md")}
    assert pages == set(PAGES[1:])
    readme = README.read_text(encoding="utf-8")
    assert all(f"]({page})" in readme for page in PAGES[1:])
    assert readme.count("\n") <= 250, "the README stays short: details go to docs/"


def test_the_pages_have_runnable_examples_of_both_kinds():
    """The parser finds the examples (a broken fence pattern would silently test nothing)."""
    for blocks, kind in ((PYTHON_BLOCKS, "python"), (BASH_BLOCKS, "bash")):
        runnable = [b for b in blocks if b.skip is None]
        assert len(runnable) >= 3, f"only {len(runnable)} runnable {kind} blocks were found"
    assert {b.page for b in PYTHON_BLOCKS if b.skip is None} >= {"README.md", "docs/training.md"}


def test_code_is_only_in_tested_fences():
    """A command or import in a plain ``` fence would escape this test: tag it python or bash."""
    for block in BLOCKS:
        if block.language in ("python", "bash"):
            continue
        code = [line for line in block.code.splitlines() if _CODE_LINE.match(line)]
        assert not code, f"{block.where}: untagged code fence holds {code[0]!r}"


@pytest.fixture(scope="module")
def python_results(tmp_path_factory):
    """Runs every python block that is not skipped; maps its line to its error (None: it ran)."""
    folder = tmp_path_factory.mktemp("docs_python")
    blocks_file, results_file = folder / "blocks.json", folder / "results.json"
    runnable = [
        dict(where=b.where, line=b.line, code=b.code) for b in PYTHON_BLOCKS if b.skip is None
    ]
    blocks_file.write_text(json.dumps(runnable))
    work = folder / "cwd"  # the blocks start in an empty folder, never in the repository
    work.mkdir()
    try:
        process = subprocess.run(
            [sys.executable, "-c", _RUNNER, str(blocks_file), str(results_file)],
            cwd=work,
            env=_env(),
            capture_output=True,
            text=True,
            timeout=PYTHON_SECONDS,
        )
        tail = process.stdout[-2000:] + process.stderr[-2000:]
    except subprocess.TimeoutExpired:
        tail = f"the python blocks ran past {PYTHON_SECONDS} s"
    results = json.loads(results_file.read_text()) if results_file.exists() else {}
    return results, tail


@pytest.mark.slow
@pytest.mark.parametrize("block", PYTHON_BLOCKS, ids=_id)
def test_python_block_runs(block, python_results):
    """The block runs to its end without raising (its own asserts included)."""
    if block.skip:
        pytest.skip(f"{block.where}: {block.skip}")
    errors, tail = python_results
    if block.where not in errors:
        pytest.fail(f"{block.where} never finished:\n{tail}", pytrace=False)
    if errors[block.where] is not None:
        pytest.fail(f"{block.where} raised:\n{errors[block.where]}", pytrace=False)


@pytest.fixture(scope="module")
def runs_dir(tmp_path_factory):
    """Stands in for `runs/`, shared by the bash blocks like a reader's folder."""
    return tmp_path_factory.mktemp("docs_runs")


@pytest.mark.slow
@pytest.mark.parametrize("block", BASH_BLOCKS, ids=_id)
def test_bash_block_runs(block, runs_dir):
    """Every command of the block exits 0 without a traceback."""
    run_bash_block(block, runs_dir)


def run_bash_block(block: Block, runs_dir: Path) -> None:
    """Runs every command of a bash block (skipping a block with a skip line); fails the test
    naming the command when one exits non-zero or prints a traceback."""
    if block.skip:
        pytest.skip(f"{block.where}: {block.skip}")
    commands = shell_commands(block.code)
    assert commands, f"{block.where}: a bash block without a command"
    for argv in commands:
        shown = shlex.join(argv)
        assert argv[0] == "python", (
            f"{block.where}: `{shown}`: only `python ...` commands run here; "
            "mark the block `# needs: ...` or `# takes: ...` if it cannot"
        )
        argv = [sys.executable] + [_RUNS.sub(lambda m: m[1] + str(runs_dir), a) for a in argv[1:]]
        process = subprocess.run(
            argv,
            cwd=ROOT,
            env=_env(),
            capture_output=True,
            text=True,
            timeout=block.seconds,
        )
        output = process.stdout + process.stderr
        if process.returncode != 0 or "Traceback" in output:
            pytest.fail(
                f"{block.where}: `{shown}` exited {process.returncode}:\n{output[-3000:]}",
                pytrace=False,
            )


def test_a_takes_line_states_its_minutes():
    """Which `# takes:` blocks run: the figure read off the line, against the lines' meaning."""
    lines = {
        "takes: half a minute (the suite runs this command with 0 steps)": 0.5,
        "takes: about 1.5 min on 2 cores, from the warm start of training.md": 1.5,
        "takes: about 6 min on 2 cores (the warm start, a 40-step GRPO pilot)": 6.0,
        "takes: hours on 2 cores (40 runs, each evaluated three times)": None,
        "takes: several minutes per run": None,
        "needs: network (make installs the notebooks extra); takes: about 3 min": None,
    }
    assert {line: stated_minutes(line) for line in lines} == lines
