"""The folders a process writes on this machine: an output folder, checked writable before any
work, and jax's persistent compilation cache under the user's cache folder.

Without a persistent cache every run compiles its step again (half a minute for the CPU-sized
runs); with it, a second run of the same config loads the compiled programs from disk. jax keys
each program by its computation, jaxlib version, platform, `XLA_FLAGS`, compile options and
devices, so a changed config, flag or upgrade compiles afresh. The folders this module chooses
hold one subfolder per processor (its architecture and a hash of its model and vector
extensions): a home folder shared by a cluster's nodes then never hands one node's CPU code,
compiled for its vector extensions, to another.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import tempfile
from collections.abc import Mapping

import jax

from gdro_jax.runtime._console import notice
from gdro_jax.runtime._environment import cpu_description

CACHE_ENV = "GDRO_COMPILATION_CACHE"
JAX_CACHE_ENV = "JAX_COMPILATION_CACHE_DIR"
_OFF = ("", "0")


def compilation_cache_dir(environ: Mapping[str, str] | None = None) -> str | None:
    """Where the persistent compilation cache goes, None when it is off.

    In order: `$GDRO_COMPILATION_CACHE` (a folder; empty or `0` turns the cache off), jax's own
    `$JAX_COMPILATION_CACHE_DIR` as set, `$XDG_CACHE_HOME/gdro_jax/jax`, `~/.cache/gdro_jax/jax`;
    all but jax's own with this processor's subfolder (`processor_name`).

    Args:
      environ: the environment to read (default: this process's).
    """
    environ = os.environ if environ is None else environ
    if CACHE_ENV in environ:
        value = environ[CACHE_ENV].strip()
        if value in _OFF:
            return None
        return os.path.join(os.path.expanduser(value), processor_name())
    if environ.get(JAX_CACHE_ENV):
        return environ[JAX_CACHE_ENV]
    base = environ.get("XDG_CACHE_HOME") or os.path.join(
        environ.get("HOME") or os.path.expanduser("~"), ".cache"
    )
    return os.path.join(base, "gdro_jax", "jax", processor_name())


def processor_name(cpuinfo: str | None = None) -> str:
    """This machine's architecture and a hash of its processor's model and vector extensions
    (`x86_64-3f9a0c2e`, from `cpu_description`): two machines share a name only when XLA:CPU
    targets the same extensions on both.

    Args:
      cpuinfo: a /proc/cpuinfo text (None: this machine's, where there is one).
    """
    cpu = cpu_description(cpuinfo)
    described = json.dumps([cpu["model"], cpu["vector_extensions"]])
    return f"{platform.machine()}-{hashlib.sha256(described.encode()).hexdigest()[:8]}"


def use_compilation_cache(environ: Mapping[str, str] | None = None) -> str | None:
    """Turns jax's persistent compilation cache on in this process, in `compilation_cache_dir`,
    before anything is compiled; returns the folder, or None when it is off.

    A folder that cannot be written turns the cache off with one notice naming it, rather than
    a warning at every compile. Programs that compile in under jax's threshold
    (`jax_persistent_cache_min_compile_time_secs`, 1 s) are not kept.

    Args:
      environ: the environment to read (default: this process's).
    """
    folder = compilation_cache_dir(environ)
    if folder is not None:
        try:
            os.makedirs(folder, exist_ok=True)
            _try_writing_in(folder)
        except OSError as error:
            notice(
                f"compilation cache off: cannot write in {folder} ({error.strerror}); set "
                f"{CACHE_ENV} to a folder you can write, or {CACHE_ENV}=0"
            )
            folder = None
    if folder is None:
        jax.config.update("jax_enable_compilation_cache", False)
        return None
    jax.config.update("jax_enable_compilation_cache", True)
    jax.config.update("jax_compilation_cache_dir", folder)
    return folder


def check_writable_folder(path: str | os.PathLike, *, name: str) -> None:
    """Raises ValueError, naming `name`, the path and the fix, unless `path` is a folder this
    process can write in, or can be created as one. Writes nothing that stays: it creates and
    removes one temporary file in the nearest folder that exists.

    Args:
      path: the output folder (existing or not).
      name: what the caller calls it (`--workdir`, `out_dir`).
    """
    given = os.fspath(path)
    if os.path.exists(given) and not os.path.isdir(given):
        raise ValueError(f"{name}={given} is a file, not a folder; pass a folder (new or existing)")
    existing = os.path.abspath(given)
    while not os.path.exists(existing):
        existing = os.path.dirname(existing)
    if not os.path.isdir(existing):
        raise ValueError(
            f"{name}={given}: {existing} is a file, so no folder can be made under it; pass a "
            f"folder (new or existing) outside it"
        )
    try:
        _try_writing_in(existing)
    except OSError as error:
        raise ValueError(
            f"{name}={given}: cannot write in {existing} ({error.strerror}); pass a folder you "
            f"can write in, or make it writable"
        ) from error


def _try_writing_in(folder: str) -> None:
    """Creates and removes a file in `folder`: the real test, where `os.access` answers from
    the permission bits as this machine sees them, which a network share may overrule (NFS
    squashing root to nobody, access lists kept by the server)."""
    descriptor, probe = tempfile.mkstemp(prefix=".gdro-write-check-", dir=folder)
    os.close(descriptor)
    os.remove(probe)
