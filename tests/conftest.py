"""Test configuration: eight fake CPU devices, so sharding code paths run on every machine, one
persistent compilation cache for the session, and the `data_dir` fixture for tests that read the
shared data files.

The cache (`JAX_COMPILATION_CACHE_DIR`, a temporary folder unless already set) is shared by both
pytest-xdist workers and every subprocess a test starts: many tests build the same tiny runs, and
a program compiled once (any program: jax's 1 s threshold is set to 0) is loaded from it
afterwards (about a sixth of the trainer tests' time, and a tenth more without the threshold).
It changes no result: a loaded executable is the compiled one.

XLA's backend (LLVM) optimisation level is 0 unless `XLA_FLAGS` sets one: the tests' tiny programs
are mostly compiled to run a few times, and LLVM's passes are most of their compile time (the
suite's CPU time falls by a fifth). Every process of the suite compiles at that level, the ones
tests start too (`XLA_FLAGS` is inherited): the level changes the last bits of float results,
and several tests compare a run in this process with one in another bit for bit.
`tests/test_docs.py` runs the documentation's commands at level 1 instead (see there).
"""

import atexit
import os
import shutil
import tempfile

# Must be set before jax is imported anywhere in the test session.
_flags = os.environ.get("XLA_FLAGS", "")
if "xla_force_host_platform_device_count" not in _flags:
    _flags += " --xla_force_host_platform_device_count=8"
if "xla_backend_optimization_level" not in _flags:
    _flags += " --xla_backend_optimization_level=0"
os.environ["XLA_FLAGS"] = _flags.strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")
if "JAX_COMPILATION_CACHE_DIR" not in os.environ:  # the first process to load this file: xdist's
    _cache = tempfile.mkdtemp(prefix="gdro-jax-test-compile-cache-")  # controller, or pytest
    os.environ["JAX_COMPILATION_CACHE_DIR"] = _cache
    atexit.register(shutil.rmtree, _cache, ignore_errors=True)
# Every program goes into it, not only those over jax's 1 s of compile time: at optimisation
# level 0 most of the suite's programs compile faster than that, and many are compiled again by
# another test (the same tiny run built anew) or the other worker (a tenth of the trainer tests'
# time here).
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")

import jax  # noqa: E402

jax.config.update("jax_numpy_rank_promotion", "allow")


import pytest  # noqa: E402

from gdro_jax import data  # noqa: E402


@pytest.fixture(scope="session")
def data_dir():
    """`gdro_jax.data.default_data_dir()`; skips tests that need the files when there is none."""
    found = data.default_data_dir()
    if found is None:
        tried = ", ".join(str(path) for path in data.data_dir_candidates())
        pytest.skip(f"no data directory: set {data.DATA_DIR_ENV} or provide one of {tried}")
    return found


# The files that take a minute or more, longest first, before all the others: pytest-xdist hands
# whole files (`--dist loadfile`) to its two workers in collection order, so a long file collected
# last would leave one worker idle while the other finishes it.
LONG_FILES_FIRST = (
    "tests/test_docs.py",
    "tests/test_docs_long.py",
    "tests/train/test_resume.py",
    "tests/train/test_multiprocess.py",
    "tests/planner/test_step_program.py",
    "tests/train/test_packed_update.py",
    "tests/train/test_step.py",
    "tests/study/test_compare.py",
    "tests/train/test_math_task.py",
    "tests/test_experiments_evaluate.py",
    "tests/warmstart/test_pretrain.py",
    "tests/test_notebooks.py",
    "tests/train/test_learning.py",
    "tests/checkpoint/test_restore_policy.py",
    "tests/train/test_update_reference.py",
    "tests/train/test_bad_input.py",
    "tests/controllers/test_contract.py",
)


def pytest_collection_modifyitems(session, config, items):
    rank = {path: index for index, path in enumerate(LONG_FILES_FIRST)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::")[0], len(rank)))  # stable
