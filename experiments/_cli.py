"""What every entry point does around its work: a quiet console and one-line user errors.

- Library INFO logging (orbax's checkpoint chatter, jax's backend probing, absl) stays off the
  console, so progress bars, tables and warnings are what a person sees; `--verbosity=0` brings
  INFO back.
- A user error (a config file that does not exist, a `--workdir` that is a file, a config field
  the library refuses with a ValueError) is one line on stderr and exit status 2, raised before
  anything is written; `GDRO_DEBUG=1` or `--verbosity=1` shows the traceback instead.
"""

import os
import sys

from absl import app, flags, logging

from gdro_jax import runtime

DEBUG_ENV = "GDRO_DEBUG"
# What the library raises for bad input (it names the field, the value and the fix).
USER_ERRORS = (ValueError, FileNotFoundError, FileExistsError, NotADirectoryError)
# Flags naming an output folder: an existing file there is refused before anything runs.
OUTPUT_FLAGS = ("workdir", "out")


def quiet_logging() -> None:
    """Shows warnings and errors only, unless `--verbosity` was given on the command line."""
    if not flags.FLAGS["verbosity"].present:
        logging.set_verbosity(logging.WARNING)


def _debugging() -> bool:
    verbosity = flags.FLAGS["verbosity"]
    return bool(os.environ.get(DEBUG_ENV)) or (verbosity.present and verbosity.value >= 1)


def _fail(message: str) -> None:
    print(f"error: {message} ({DEBUG_ENV}=1 shows the traceback)", file=sys.stderr)
    sys.exit(2)


def _config_files(argv: list[str]) -> list[tuple[str, str]]:
    """`(flag, path)` of every `--<name>=<file>.py[:args]` config flag on the command line."""
    found = []
    for index, arg in enumerate(argv):
        if not arg.startswith("--config"):
            continue
        name, _, value = arg.partition("=")
        if not value and index + 1 < len(argv):
            value = argv[index + 1]
        path = value.split(":", 1)[0]
        if "." not in name[2:] and path.endswith(".py"):
            found.append((name, path))
    return found


def _check_outputs() -> None:
    for name in OUTPUT_FLAGS:
        if name in flags.FLAGS and flags.FLAGS[name].value:
            path = flags.FLAGS[name].value
            if os.path.exists(path) and not os.path.isdir(path):
                _fail(f"--{name}={path} is a file, not a folder; pass a folder (new or existing)")


def define_process_flags() -> None:
    """Defines the flags that join a run of several processes (`join_processes` reads them)."""
    flags.DEFINE_string(
        "coordinator_address",
        None,
        "Several processes: process 0's host:port (with the two below).",
    )
    flags.DEFINE_integer("num_processes", None, "Several processes: how many.")
    flags.DEFINE_integer("process_id", None, "Several processes: this one's index.")
    flags.DEFINE_bool(
        "distributed", False, "Several processes, found by JAX (SLURM, Open MPI, Cloud TPU, GKE)."
    )


def join_processes() -> bool:
    """Joins a multi-process run (the flags, or a SLURM job / TPU slice), before any device is
    touched; nothing for one process. True when several processes run."""
    values = flags.FLAGS
    return runtime.initialize(
        values.coordinator_address,
        values.num_processes,
        values.process_id,
        auto=values.distributed,
    )


def run(main) -> None:
    """`absl.app.run(main)` with a quiet console and one-line user errors (see the module doc)."""
    for name, path in _config_files(sys.argv[1:]):
        # Checked before absl parses the flags: its own error is a long chained traceback.
        if not os.path.isfile(path):
            _fail(f"{name}={path}: no such config file (paths are relative to {os.getcwd()})")

    def guarded_main(argv):
        quiet_logging()
        _check_outputs()
        try:
            return main(argv)
        except USER_ERRORS as error:
            if _debugging():
                raise
            _fail(str(error))

    app.run(guarded_main)
