"""Fixtures for the reward tests: the labelled completions in the shared data directory."""

import pytest

from gdro_jax import data

COMPLETIONS_FILE = "grader_test_completions.jsonl"


@pytest.fixture(scope="session")
def labelled_completions():
    """Rows of grader_test_completions.jsonl; skips when the data directory is missing."""
    found = data.default_data_dir()
    if found is None:
        tried = ", ".join(str(path) for path in data.data_dir_candidates())
        pytest.skip(f"no data directory: set {data.DATA_DIR_ENV} or provide one of {tried}")
    return data.read_jsonl(found / COMPLETIONS_FILE)
