"""The suite's scheduling hint names files that exist (a renamed file would silently run last)."""

import os

from tests.conftest import HEAVY_FIRST

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_every_heavy_first_entry_is_a_test_file():
    missing = [path for path in HEAVY_FIRST if not os.path.isfile(os.path.join(ROOT, path))]
    assert not missing, f"tests/conftest.py HEAVY_FIRST names files that do not exist: {missing}"
    assert len(set(HEAVY_FIRST)) == len(HEAVY_FIRST)
