"""The planner's search for the largest micro-batch that fits, against brute force."""

import itertools

import pytest

from gdro_jax.planner._plan import _largest_fitting

CANDIDATES = [1024, 512, 256, 128, 64, 32, 16, 8]


def _counted(threshold):
    """A monotone `fits` (sizes up to `threshold` fit) that records every size it is asked."""
    asked = []

    def fits(slots):
        asked.append(slots)
        return slots <= threshold

    return fits, asked


THRESHOLDS = [0, 8, 12, 16, 100, 128, 256, 700, 1024, 5000]


@pytest.mark.parametrize(
    "threshold, known", list(itertools.product(THRESHOLDS, [None, *CANDIDATES, 48]))
)
def test_the_search_finds_what_brute_force_finds(threshold, known):
    fits, asked = _counted(threshold)
    brute = max((c for c in CANDIDATES if c <= threshold), default=None)
    assert _largest_fitting(CANDIDATES, fits, known=known) == brute
    # Bisection: never more than the sides' log2 plus the two ends and the known size.
    assert len(asked) <= 5, asked


@pytest.mark.parametrize("known", CANDIDATES[1:])
def test_a_config_whose_own_size_is_the_largest_that_fits_costs_one_compile_more(known):
    """The plan has compiled its own size: the search asks only the next larger one (the whole
    range again, as before `known`, is 3-4 compiles of the 8B rollout, 8 windows each)."""
    fits, asked = _counted(known)
    assert _largest_fitting(CANDIDATES, fits, known=known) == known
    assert asked == [known, CANDIDATES[CANDIDATES.index(known) - 1]]
