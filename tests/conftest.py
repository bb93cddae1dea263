"""Test configuration: eight fake CPU devices, so sharding code paths run on every machine, one
persistent compilation cache for the session, and the `data_dir` fixture for tests that read the
shared data files.

The cache (`JAX_COMPILATION_CACHE_DIR`, a temporary folder unless already set) is shared by both
pytest-xdist workers and every subprocess a test starts: many tests build the same tiny runs, and
a program compiled once (those over jax's 1 s threshold) is loaded from it afterwards (about a
sixth of the trainer tests' time). It changes no result: a loaded executable is the compiled one.

`make test` runs two workers that take whole files (`--dist loadfile --no-loadscope-reorder`):
the longest files are collected first (`HEAVY_FIRST`), so the many short ones fill the gaps at
the end and both workers finish together, instead of one long file running alone last.
"""

import atexit
import os
import shutil
import tempfile

# Must be set before jax is imported anywhere in the test session.
_flags = os.environ.get("XLA_FLAGS", "")
if "xla_force_host_platform_device_count" not in _flags:
    os.environ["XLA_FLAGS"] = (_flags + " --xla_force_host_platform_device_count=8").strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")
if "JAX_COMPILATION_CACHE_DIR" not in os.environ:  # the first process to load this file: xdist's
    _cache = tempfile.mkdtemp(prefix="gdro-jax-test-compile-cache-")  # controller, or pytest
    os.environ["JAX_COMPILATION_CACHE_DIR"] = _cache
    atexit.register(shutil.rmtree, _cache, ignore_errors=True)

import jax  # noqa: E402

jax.config.update("jax_numpy_rank_promotion", "allow")


import pytest  # noqa: E402

from gdro_jax import data  # noqa: E402


# The files that take longest on 2 cores (their fixtures start processes or train), longest
# first. Only the order of the run depends on it: a file missing here runs after these.
HEAVY_FIRST = (
    "tests/train/test_multiprocess.py",
    "tests/train/test_resume.py",
    "tests/test_experiments_evaluate.py",
    "tests/test_readme.py",
    "tests/train/test_learning.py",
    "tests/train/test_step.py",
    "tests/test_notebooks.py",
    "tests/train/test_bad_input.py",
    "tests/study/test_compare.py",
)


def pytest_collection_modifyitems(config, items):
    """Collects the files of `HEAVY_FIRST` first, in its order (a stable sort: the tests of a
    file, and the other files, keep their order)."""
    del config
    rank = {path: i for i, path in enumerate(HEAVY_FIRST)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::")[0], len(rank)))


@pytest.fixture(scope="session")
def data_dir():
    """`gdro_jax.data.default_data_dir()`; skips tests that need the files when there is none."""
    found = data.default_data_dir()
    if found is None:
        tried = ", ".join(str(path) for path in data.data_dir_candidates())
        pytest.skip(f"no data directory: set {data.DATA_DIR_ENV} or provide one of {tried}")
    return found
