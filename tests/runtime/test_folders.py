"""Output folders checked before any work, and the persistent compilation cache.

The writability check is held to what the file system does (a write there fails or not); the
cache to what jax itself reports: its `/jax/compilation_cache/cache_hits` monitoring event, and
the entries it writes into the folder, read from processes of their own (jax chooses its cache
folder once per process).
"""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from gdro_jax import runtime
from gdro_jax.runtime._folders import processor_name
from tests._folders import read_only, tree

ROOT = Path(__file__).resolve().parents[2]


def test_a_writable_folder_passes_and_is_left_as_it_was(tmp_path):
    (tmp_path / "notes.txt").write_text("mine\n")
    before = tree(tmp_path)
    runtime.check_writable_folder(tmp_path, name="--workdir")
    runtime.check_writable_folder(tmp_path / "new" / "run", name="--workdir")
    assert tree(tmp_path) == before  # no probe left behind, nothing created


@pytest.mark.parametrize(
    ("given", "fragment"),
    [("notes.txt", "is a file, not a folder"), ("notes.txt/run", "notes.txt is a file, so")],
    ids=["a-file", "under-a-file"],
)
def test_a_file_in_the_way_is_named(tmp_path, given, fragment):
    (tmp_path / "notes.txt").write_text("mine\n")
    with pytest.raises(
        ValueError, match=rf"^--out={re.escape(str(tmp_path / given))}\b.*{fragment}"
    ):
        runtime.check_writable_folder(tmp_path / given, name="--out")


def test_a_read_only_folder_is_named_with_the_fix(tmp_path):
    """Planted: the check made a no-op (nothing raised)."""
    folder = tmp_path / "shared"
    folder.mkdir()
    with read_only(folder):
        for given in (folder, folder / "new" / "run"):
            with pytest.raises(ValueError, match=rf"cannot write in {folder} .*writable"):
                runtime.check_writable_folder(given, name="--workdir")


def test_the_cache_folder_follows_the_environment(tmp_path):
    """The order `compilation_cache_dir` documents, against paths written out here."""
    machine = processor_name()
    mine, theirs, xdg, home = (str(tmp_path / name) for name in ("mine", "jax", "xdg", "home"))
    both = {"GDRO_COMPILATION_CACHE": mine, "JAX_COMPILATION_CACHE_DIR": theirs}
    cases = [
        (both, f"{mine}/{machine}"),
        ({"GDRO_COMPILATION_CACHE": "0", "JAX_COMPILATION_CACHE_DIR": theirs}, None),
        ({"GDRO_COMPILATION_CACHE": "", "XDG_CACHE_HOME": xdg}, None),
        ({"JAX_COMPILATION_CACHE_DIR": theirs, "XDG_CACHE_HOME": xdg}, theirs),
        ({"XDG_CACHE_HOME": xdg, "HOME": home}, f"{xdg}/gdro_jax/jax/{machine}"),
        ({"HOME": home}, f"{home}/.cache/gdro_jax/jax/{machine}"),
    ]  # fmt: skip
    for environ, expected in cases:
        assert runtime.compilation_cache_dir(environ) == expected, environ
    assert re.fullmatch(r"\w+-[0-9a-f]{8}", machine) and machine == processor_name()


def test_the_processor_folder_changes_with_the_vector_extensions_only():
    """Planted: the name from the architecture alone (one folder for every x86_64 node)."""
    base = "processor\t: 0\nmodel name\t: Some CPU\nflags\t\t: fpu sse2 avx2 fma\n\n"
    wider = base.replace("fma", "fma avx512f")
    assert processor_name(base) == processor_name(base) != processor_name(wider)
    assert processor_name(base.replace("fpu ", "")) == processor_name(base)  # not a vector flag


# One process: turns the cache on as the entry points do, compiles one program (kept whatever
# its compile time), and prints the cache folder and jax's count of cache hits.
_COMPILE_ONCE = """
import json
import jax, jax.numpy as jnp
from jax import monitoring
from gdro_jax import runtime
from gdro_jax.runtime._folders import processor_name
hits = []
monitoring.register_event_listener(
    lambda event, **_: hits.append(event) if event == "/jax/compilation_cache/cache_hits" else None
)
folder = runtime.use_compilation_cache()
value = jax.jit(lambda x: jnp.tanh(x @ x.T).sum())(jnp.ones((32, 32)))
print(json.dumps({"folder": folder, "hits": len(hits), "value": float(value)}))
"""


def _compile_once(**environ):
    env = {k: v for k, v in os.environ.items() if k not in ("JAX_COMPILATION_CACHE_DIR",)}
    env.update(JAX_PLATFORMS="cpu", JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0", **environ)
    completed = subprocess.run(
        [sys.executable, "-c", _COMPILE_ONCE], cwd=ROOT, env=env, capture_output=True,
        text=True, timeout=120,
    )  # fmt: skip
    assert completed.returncode == 0, completed.stderr[-3000:]
    return json.loads(completed.stdout.splitlines()[-1]), completed.stderr


def test_a_second_process_loads_the_program_from_the_users_cache_folder(tmp_path):
    """Planted: `use_compilation_cache` not setting jax's folder (no entries, no hit)."""
    xdg = tmp_path / "xdg"
    first, _ = _compile_once(XDG_CACHE_HOME=str(xdg))
    folder = Path(first["folder"])
    assert folder.parent == xdg / "gdro_jax" / "jax"
    entries = tree(folder)
    assert first["hits"] == 0 and entries  # compiled, and kept
    second, _ = _compile_once(XDG_CACHE_HOME=str(xdg))
    assert second["hits"] >= 1 and second["value"] == first["value"]
    assert tree(folder) == entries  # found there: nothing compiled or written again


def test_a_cache_folder_that_cannot_be_written_turns_the_cache_off_with_one_line(tmp_path):
    (tmp_path / "notes.txt").write_text("mine\n")
    blocked = tmp_path / "notes.txt" / "cache"
    result, stderr = _compile_once(GDRO_COMPILATION_CACHE=str(blocked))
    assert result["folder"] is None and result["hits"] == 0
    lines = [line for line in stderr.splitlines() if "compilation cache" in line]
    assert len(lines) == 1 and lines[0].startswith("compilation cache off: cannot write in ")
    assert "GDRO_COMPILATION_CACHE=0" in lines[0]
    assert (tmp_path / "notes.txt").read_text() == "mine\n"


# `experiments.train` as typed, with jax's count of cache hits printed last on stderr.
_TRAIN_COUNTING_HITS = """
import atexit, runpy, sys
from jax import monitoring
hits = []
monitoring.register_event_listener(
    lambda event, **_: hits.append(event) if event == "/jax/compilation_cache/cache_hits" else None
)
atexit.register(lambda: print(f"cache hits: {len(hits)}", file=sys.stderr))
sys.argv = ["experiments.train", *sys.argv[1:]]
runpy.run_module("experiments.train", run_name="__main__", alter_sys=True)
"""


@pytest.mark.slow
def test_a_second_training_run_loads_its_step_from_the_cache(tmp_path):
    """Two 2-step runs of one config in two processes: the first keeps the step's programs in
    the cache folder, the second finds every one there (jax's hit count), writes none, and
    trains to the same metrics. Every program is kept, whatever its compile time: with jax's
    1 s threshold, one that compiles in about a second may be kept by one run and not the
    other. Planted: the entry points not turning the cache on (no entries in the folder)."""
    cache = tmp_path / "cache"
    env = {k: v for k, v in os.environ.items() if k != "JAX_COMPILATION_CACHE_DIR"}
    env.update(JAX_PLATFORMS="cpu", GDRO_COMPILATION_CACHE=str(cache))
    env.update(JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0")
    runs, entries = [], []
    for name in ("first", "second"):
        completed = subprocess.run(
            [
                sys.executable, "-c", _TRAIN_COUNTING_HITS,
                "--config=experiments/configs/tiny_cpu.py", f"--workdir={tmp_path / name}",
                "--config.steps=2", "--config.num_prompts=4", "--config.n_mean=2",
                "--config.max_new_tokens=8", "--config.model.num_layers=1",
                "--config.task.pool_size=16", "--config.progress=False",
            ],
            cwd=ROOT, env=env, capture_output=True, text=True, timeout=600,
        )  # fmt: skip
        assert completed.returncode == 0, completed.stderr[-3000:]
        runs.append(int(re.search(r"cache hits: (\d+)", completed.stderr)[1]))
        entries.append(tree(cache))
    kept = [Path(name).name.split("-")[0] for name in entries[0] if name.endswith("-cache")]
    assert {"jit_rollout", "jit_update"} <= set(kept), kept
    assert runs[0] == 0 and runs[1] >= len(kept)  # a program met twice in a run: two hits
    assert entries[1] == entries[0]
    rows = [
        (tmp_path / name / "metrics.jsonl").read_text().splitlines() for name in ("first", "second")
    ]
    for first, second in zip(*rows, strict=True):
        untimed = [
            {k: v for k, v in json.loads(r).items() if not k.startswith("time/")}
            for r in (first, second)
        ]
        assert untimed[0] == untimed[1]
