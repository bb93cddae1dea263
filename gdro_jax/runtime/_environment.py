"""The machine and the software a result was made with (`environment`), for every result file.

A run is reproducible bit for bit only on one machine type: XLA compiles CPU code for the
processor it runs on (its vector extensions decide the instructions, and with them the order of
float additions), and other package versions compile other programs. So each result file says
what made it: the key package versions, Python, the JAX backend and its devices, the CPU model
and its vector extensions, `XLA_FLAGS`, and the source's git commit.
"""

from __future__ import annotations

import functools
import importlib.metadata
import os
import pathlib
import platform
import subprocess
from typing import Any

import jax

# The distributions whose versions decide what a run computes (pip names).
PACKAGES = ("jax", "jaxlib", "flax", "optax", "orbax-checkpoint", "numpy", "grain", "chex")
# /proc/cpuinfo flags (x86 `flags`, ARM `Features`) that decide which vector code XLA emits.
VECTOR_PREFIXES = ("sse", "ssse", "avx", "fma", "f16c", "amx", "asimd", "sve", "neon")
_CPUINFO = pathlib.Path("/proc/cpuinfo")


def _cpuinfo_fields(text: str) -> dict[str, str]:
    """The first processor's `name: value` lines of a /proc/cpuinfo text."""
    fields: dict[str, str] = {}
    for line in text.splitlines():
        if not line.strip():
            if fields:
                break  # the end of the first processor's block
            continue
        name, _, value = line.partition(":")
        fields.setdefault(name.strip(), value.strip())
    return fields


def cpu_description(cpuinfo: str | None = None) -> dict[str, Any]:
    """The CPU: `model` and its `vector_extensions` (sorted), with `source` saying where they
    were read.

    Args:
      cpuinfo: a /proc/cpuinfo text (None: this machine's, where there is one).

    Returns:
      `{"model", "vector_extensions", "source"}`. Without /proc/cpuinfo (macOS, Windows) the
      model is `platform.processor()` (else the machine type) and the extensions are an empty
      list, with `source` "platform".
    """
    if cpuinfo is None and _CPUINFO.is_file():
        try:
            cpuinfo = _CPUINFO.read_text(errors="replace")
        except OSError:
            cpuinfo = None
    if cpuinfo:
        fields = _cpuinfo_fields(cpuinfo)
        model = (
            fields.get("model name")
            or fields.get("Hardware")
            or fields.get("cpu model")
            or " ".join(f"{k} {fields[k]}" for k in ("CPU implementer", "CPU part") if k in fields)
            or platform.machine()
        )
        flags = (fields.get("flags") or fields.get("Features") or "").split()
        vector = sorted({f for f in flags if f.startswith(VECTOR_PREFIXES)})
        return {"model": model, "vector_extensions": vector, "source": "/proc/cpuinfo"}
    model = platform.processor() or platform.machine() or "unknown"
    return {"model": model, "vector_extensions": [], "source": "platform"}


def _version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


@functools.cache
def _source_commit() -> str | None:
    """The git commit of gdro_jax's source tree, or None (an installed copy, no git)."""
    try:
        done = subprocess.run(
            ["git", "rev-parse", "HEAD"],
            cwd=pathlib.Path(__file__).resolve().parent,
            capture_output=True,
            text=True,
            timeout=5,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    commit = done.stdout.strip()
    return commit if done.returncode == 0 and len(commit) == 40 else None


def environment() -> dict[str, Any]:
    """What made a result: the record every result file carries under `"environment"`.

    Returns:
      A JSON-ready dict: `python`, `packages` (pip name -> version, None when not installed),
      `backend` (`jax.default_backend()`), `devices` (`count`, `kind` of the first device,
      `processes`), `cpu` (`cpu_description()` plus `cores`), `platform`, `xla_flags` (the
      `XLA_FLAGS` environment variable, "" when unset) and `commit` (the source's git commit,
      None outside a git checkout).
    """
    devices = jax.devices()
    return {
        "python": platform.python_version(),
        "packages": {name: _version(name) for name in PACKAGES},
        "backend": jax.default_backend(),
        "devices": {
            "count": len(devices),
            "kind": devices[0].device_kind,
            "processes": jax.process_count(),
        },
        "cpu": {**cpu_description(), "cores": os.cpu_count()},
        "platform": platform.platform(),
        "xla_flags": os.environ.get("XLA_FLAGS", ""),
        "commit": _source_commit(),
    }
