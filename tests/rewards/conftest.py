"""Fixtures for the reward tests: the labelled completions in the shared data directory."""

import pytest

from gdro_jax import data

COMPLETIONS_FILE = "grader_test_completions.jsonl"


@pytest.fixture(scope="session")
def labelled_completions(data_dir):
    """Rows of grader_test_completions.jsonl; skips when the data directory is missing."""
    return data.read_jsonl(data_dir / COMPLETIONS_FILE)
