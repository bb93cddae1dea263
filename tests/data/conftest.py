"""Fixtures for the data tests: the shared data directory, or a skip saying why it is missing."""

import pytest

from gdro_jax import data


@pytest.fixture(scope="session")
def data_dir():
    """`gdro_jax.data.default_data_dir()`; skips tests that need the files when there is none."""
    found = data.default_data_dir()
    if found is None:
        tried = ", ".join(str(path) for path in data.data_dir_candidates())
        pytest.skip(f"no data directory: set {data.DATA_DIR_ENV} or provide one of {tried}")
    return found
