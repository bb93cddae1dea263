"""Helpers of the tests of output folders: a folder's files with their hashes, and a folder made
read-only for the user running the tests."""

import contextlib
import hashlib
import os
import subprocess
from pathlib import Path

import pytest


def tree(folder: Path) -> dict[str, str]:
    """Every file and folder under `folder`, each file with its content's hash."""
    return {
        str(path.relative_to(folder)): (
            hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else "folder"
        )
        for path in sorted(folder.rglob("*"))
    }


@contextlib.contextmanager
def read_only(folder: Path):
    """`folder` made read-only for this user. The suite may run as root (CI's containers do),
    whom permission bits do not stop: then the folder is made immutable (`chattr +i`, which
    needs CAP_LINUX_IMMUTABLE and a file system that has the attribute), else the test skips."""
    if os.geteuid() != 0:
        folder.chmod(0o555)
        undo = ["chmod", "755", str(folder)]
    else:
        made = subprocess.run(["chattr", "+i", str(folder)], capture_output=True, text=True)
        if made.returncode != 0:
            pytest.skip(f"root without an immutable attribute here: {made.stderr.strip()}")
        undo = ["chattr", "-i", str(folder)]
    try:
        with pytest.raises(OSError):  # the premise: this user cannot write there
            (folder / "probe").write_text("")
        yield
    finally:
        subprocess.run(undo, check=True)
