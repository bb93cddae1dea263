"""Where the dataset files live: one resolution rule shared by the loaders, tests and benchmarks.

The data directory is, in order: the `data_dir` argument when given; the environment variable
`GDRO_DATA_DIR` when set (then it is the only candidate, so a typo fails loudly instead of silently
reading another copy); otherwise `../shared/data` relative to the current working directory, then
relative to the repository root (the folder holding `gdro_jax/`).
"""

from __future__ import annotations

import os
from pathlib import Path

DATA_DIR_ENV = "GDRO_DATA_DIR"

# gdro_jax/data/_paths.py -> parents[2] is the repository root.
_REPO_ROOT = Path(__file__).resolve().parents[2]


def data_dir_candidates() -> list[Path]:
    """The directories `default_data_dir` tries, in order.

    Returns:
      `[Path($GDRO_DATA_DIR)]` when the variable is set and non-empty, else
      `[cwd/../shared/data, repo_root/../shared/data]` (duplicates removed).
    """
    from_env = os.environ.get(DATA_DIR_ENV, "").strip()
    if from_env:
        return [Path(from_env).expanduser()]
    candidates = []
    for base in (Path.cwd(), _REPO_ROOT):
        candidate = (base / ".." / "shared" / "data").resolve()
        if candidate not in candidates:
            candidates.append(candidate)
    return candidates


def default_data_dir() -> Path | None:
    """The first existing directory of `data_dir_candidates()`, or None when none exists."""
    for candidate in data_dir_candidates():
        if candidate.is_dir():
            return candidate
    return None


def resolve_data_dir(data_dir: str | os.PathLike | None = None) -> Path:
    """The data directory to read from.

    Args:
      data_dir: an explicit directory; None uses `default_data_dir()`.

    Returns:
      The directory as a `Path`.

    Raises:
      FileNotFoundError: naming `data_dir` or every candidate tried, when none exists.
    """
    if data_dir is not None:
        path = Path(data_dir).expanduser()
        if not path.is_dir():
            raise FileNotFoundError(f"data_dir={str(data_dir)!r} is not a directory")
        return path
    found = default_data_dir()
    if found is None:
        tried = ", ".join(str(path) for path in data_dir_candidates())
        raise FileNotFoundError(
            f"no data directory found (tried {tried}); pass data_dir=... or set {DATA_DIR_ENV}"
        )
    return found
