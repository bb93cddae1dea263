"""The documentation's `# takes: ...` bash blocks that state at most `TAKES_MINUTES` minutes, run
in page order from a `runs/` folder of their own (`tests/test_docs.py` says how the blocks run).

A file of its own: pytest-xdist hands whole files to its workers, so these minutes run beside
the rest of the docs' examples instead of after them.
"""

import pytest

from tests.test_docs import LONG_BASH_BLOCKS, _id, run_bash_block

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def runs_dir(tmp_path_factory):
    """Stands in for `runs/`, shared by these blocks in page order (a later page's command may
    use an earlier one's run: checkpoints.md resumes from training.md's warm start)."""
    return tmp_path_factory.mktemp("docs_long_runs")


def test_some_long_blocks_run():
    """The blocks' time parser finds them (a broken one would silently skip them all)."""
    assert len(LONG_BASH_BLOCKS) >= 3


@pytest.mark.parametrize("block", LONG_BASH_BLOCKS, ids=_id)
def test_long_bash_block_runs(block, runs_dir):
    """Every command of the block exits 0 without a traceback, within four times the time
    its `# takes:` line states."""
    run_bash_block(block, runs_dir)
