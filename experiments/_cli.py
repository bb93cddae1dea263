"""What every entry point does around its work: a quiet console and one-line user errors.

- Library INFO logging (orbax's checkpoint chatter, jax's backend probing, absl) stays off the
  console, so progress bars, tables and warnings are what a person sees; `--verbosity=0` brings
  INFO back.
- A usage error (a config file that does not exist, does not load (a syntax error, an import
  that fails) or defines no `get_config`, a `--config.X` override of a field the config does not
  have or of the wrong type, a required flag left out, an unknown flag, a `--workdir` or `--out`
  that is a file or a folder this process cannot write in, a config field the library refuses
  with a ValueError) is one line on stderr, `error: ...` naming the flag or field, the value and
  the fix, and exit status 2 (the Unix convention for usage errors), raised before anything is
  written; `GDRO_DEBUG=1` or `--verbosity=1` shows the traceback instead.
- jax's persistent compilation cache is on (`runtime.use_compilation_cache`: under the user's
  cache folder, `GDRO_COMPILATION_CACHE=<folder>` or `=0` to change it), so a second run of a
  config loads its compiled step instead of compiling it again.
- Log records print above progress bars (`runtime.logging_above_bars`), never inside one.
- `--help` (and `-h`) prints the entry point's help from the config schema (`_help`) and exits
  0; `--helpfull` keeps absl's full list of every library's flags.
"""

import importlib.util
import os
import pathlib
import re
import shlex
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from absl import app, flags, logging

from experiments import _help
from gdro_jax import configs, planner, runtime, sim, step

DEBUG_ENV = "GDRO_DEBUG"
# What the library raises for bad input (it names the field, the value and the fix).
# A missing optional extra (`step.MissingExtraError`) too: the message says what to install.
USER_ERRORS = (
    ValueError,
    FileNotFoundError,
    FileExistsError,
    NotADirectoryError,
    step.MissingExtraError,
)
# Flags naming an output folder: a file there, or a folder this process cannot write in, is
# refused before anything runs.
OUTPUT_FLAGS = ("workdir", "out", "results")
HELP_FLAGS = ("--help", "-h", "--helpshort", "-?")
# Where the help of a study's or the demo's config fields comes from: its RL and warm-start blocks.
STUDY_SCHEMAS = {"train.": configs.run_schema, "pretrain.": configs.pretrain_schema}


def _sim_schema():
    return configs.from_dataclass(sim.SimConfig)


SIM_SCHEMAS = {"": _sim_schema}  # the simulator's config: `sim.SimConfig`'s fields


def quiet_logging() -> None:
    """Shows warnings and errors only, unless `--verbosity` was given on the command line."""
    if not flags.FLAGS["verbosity"].present:
        logging.set_verbosity(logging.WARNING)


def _debugging() -> bool:
    verbosity = flags.FLAGS["verbosity"]
    debug = os.environ.get(DEBUG_ENV, "").strip() not in ("", "0")  # GDRO_DEBUG=0: off
    return debug or (verbosity.present and verbosity.value >= 1)


def _fail(message: str, *, traceback: bool = True) -> None:
    hint = f" ({DEBUG_ENV}=1 shows the traceback)" if traceback else ""
    print(f"error: {message}{hint}", file=sys.stderr)
    sys.exit(2)


def _config_files(argv: list[str]) -> list[tuple[str, str]]:
    """`(flag, file[:args])` of each `--<name>=<file>.py[:args]` config flag on the command line."""
    found = []
    for index, arg in enumerate(argv):
        if not arg.startswith("--config"):
            continue
        name, _, value = arg.partition("=")
        if not value and index + 1 < len(argv):
            value = argv[index + 1]
        if "." not in name[2:] and value.split(":", 1)[0].endswith(".py"):
            found.append((name, value))
    return found


def _load_config(value: str):
    """What `config_flags` loads for `--config=<file>.py[:args]`: the file's `get_config()`."""
    path, _, argument = value.partition(":")
    spec = importlib.util.spec_from_file_location("_config_file", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    if not callable(getattr(module, "get_config", None)):
        raise _NoGetConfig
    return module.get_config(argument) if argument else module.get_config()


class _NoGetConfig(Exception):
    """A config file that defines no `get_config`."""


def _checked_config(name: str, value: str):
    """`_load_config(value)`, with what stops it (a syntax error, a failing import, no
    `get_config`, `get_config` raising) as one `error:` line naming the file and the fix."""
    path, _, argument = value.partition(":")
    try:
        return _load_config(value)
    except _NoGetConfig:
        _fail(
            f"{name}={path} defines no get_config(); a config file defines get_config() "
            "returning an ml_collections.ConfigDict (as experiments/configs/tiny_cpu.py does)",
            traceback=False,
        )
    except SyntaxError as error:
        if _debugging():
            raise
        where = f"line {error.lineno}"
        if error.filename and os.path.abspath(error.filename) != os.path.abspath(path):
            where = f"{error.filename}, {where}"  # a module the config file imports
        _fail(f"{name}={path}: {where}: {error.msg}; fix the file's syntax")
    except Exception as error:  # the file is the user's: whatever it raises, say where
        if _debugging():
            raise
        fix = f"check the argument {argument!r} or fix the file" if argument else "fix the file"
        _fail(f"{name}={value}: loading it raised {type(error).__name__}: {error}; {fix}")


def _check_overrides(argv: list[str], loaded: Mapping[str, Any]) -> None:
    """Refuses a `--<config>.<field>=...` override of a field the loaded config (`loaded`: each
    config flag's config) does not have, naming the first missing part and the nearest names
    the config has there."""
    for arg in argv:
        match = re.match(r"--(?:no)?(\w+)\.([\w.]+)", arg)
        if not match or f"--{match[1]}" not in loaded:
            continue
        flag, path = match[1], match[2]
        node, parts = loaded[f"--{flag}"], path.split(".")
        for depth, part in enumerate(parts):
            where = ".".join([flag, *parts[:depth]])
            if not hasattr(node, "keys"):
                _fail(f"--{flag}.{path}: {where} is a value, not a block", traceback=False)
            if part not in node:
                hint = configs.nearest(part, list(node.keys()))
                _fail(f"--{flag}.{path}: {where} has no field {part!r}; {hint}", traceback=False)
            node = node[part]


def _check_outputs() -> None:
    for name in OUTPUT_FLAGS:
        if name in flags.FLAGS and flags.FLAGS[name].value:
            try:
                runtime.check_writable_folder(flags.FLAGS[name].value, name=f"--{name}")
            except ValueError as error:
                _fail(str(error), traceback=False)


def define_process_flags() -> None:
    """Defines the flags that join a run of several processes (`join_processes` reads them),
    under their own heading in the help."""
    heading = dict(module_name=_help.PROCESS_FLAGS)
    flags.DEFINE_string(
        "coordinator_address", None, "Process 0's host:port (with the two below).", **heading
    )
    flags.DEFINE_integer("num_processes", None, "How many processes.", **heading)
    flags.DEFINE_integer("process_id", None, "This process's index.", **heading)
    flags.DEFINE_bool(
        "distributed",
        False,
        "Let JAX find the processes (SLURM, Open MPI, Cloud TPU, GKE).",
        **heading,
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


def wrote(folder, files: Mapping[str, str], *, more: bool = True) -> str:
    """The closing lines of a command: the folder it wrote, and the files a person opens first
    with what each holds and its size (those that exist), then how many other files it holds.

        Wrote runs/grpo_eval/:
          report.md          the table above, in Markdown (1.9 KiB)
          completions.jsonl  every completion, its answer and verdict (1.20 MiB)
    """
    folder = pathlib.Path(folder)
    shown = {name: what for name, what in files.items() if (folder / name).exists()}
    width = max((len(name) for name in shown), default=0) + 2
    lines = [f"Wrote {folder}/:"]
    for name, what in shown.items():
        path = folder / name
        size = (
            sum(f.stat().st_size for f in path.rglob("*") if f.is_file())
            if path.is_dir()
            else (path.stat().st_size)
        )
        lines.append(f"  {name:<{width}}{what} ({planner.format_size(size)})")
    others = [p for p in folder.iterdir() if p.name not in shown] if folder.is_dir() else []
    if more and others:
        lines.append(f"  and {len(others)} more: {', '.join(sorted(p.name for p in others))}")
    return "\n".join(lines)


def command_line() -> str:
    """The command that is running, as a person would type it again
    (`python -m experiments.train --config=... --workdir=...`)."""
    module = _help.program_name()
    program = ["python", "-m", module] if module else ["python", sys.argv[0]]
    return shlex.join([*program, *sys.argv[1:]])


def _example_value(doc: str | None, name: str) -> str | None:
    """The value the docstring's example command gives `--<name>`."""
    match = re.search(rf"--{name}=(\S+)", _help.example_command(doc) or "")
    return match[1] if match else None


def _parse_flags(argv: list[str]) -> list[str]:
    """absl's flag parsing, with its errors (an unknown flag, a value of the wrong type) as one
    `error:` line and exit status 2 instead of absl's FATAL message and status 1."""
    try:
        return flags.FLAGS(argv)
    except flags.Error as error:
        _fail(f"{error}; --help lists the flags and config fields", traceback=False)


def _print_help(doc, files, loaded, required, schemas) -> None:
    config, config_file = None, None
    if "--config" in files:
        config_file, config = files["--config"], loaded["--config"]
    elif schemas and "" in schemas:
        config = configs.config_from_schema(schemas[""]())
    text = _help.help_text(
        doc, required=required, config=config, config_file=config_file, schemas=schemas
    )
    print(text)


def run(
    main,
    *,
    required: Sequence[str] = (),
    schemas: Mapping[str, Callable[[], Mapping[str, Any]]] | None = None,
) -> None:
    """`absl.app.run(main)` with a quiet console, one-line usage errors and `--help` from the
    schema (see the module doc).

    Args:
      main: the entry point's main.
      required: flags that must be given (checked after parsing: one `error:` line, status 2).
      schemas: where the help of the config's fields comes from: `{"": configs.run_schema}` for
        a run config, `{"train.": ..., "pretrain.": ...}` for a study config's blocks.
    """
    doc = sys.modules["__main__"].__doc__
    argv = sys.argv[1:]
    # Checked before absl parses the flags: its own errors are long chained tracebacks.
    files = dict(_config_files(argv))
    for name, value in files.items():
        path = value.split(":", 1)[0]
        if not os.path.isfile(path):
            _fail(
                f"{name}={path}: no such config file (paths are relative to {os.getcwd()})",
                traceback=False,
            )
    loaded = {name: _checked_config(name, value) for name, value in files.items()}
    if any(arg in HELP_FLAGS for arg in argv):
        _print_help(doc, files, loaded, required, schemas)
        sys.exit(0)
    _check_overrides(argv, loaded)

    def guarded_main(argv):
        quiet_logging()
        for name in required:
            if flags.FLAGS[name].value is None:
                example = _example_value(doc, name)
                fix = f"e.g. --{name}={example}" if example else "--help shows an example"
                _fail(f"--{name} is missing: {flags.FLAGS[name].help} ({fix})", traceback=False)
        _check_outputs()
        runtime.use_compilation_cache()  # before anything compiles
        try:
            with runtime.logging_above_bars():  # warnings print above progress bars, not in them
                return main(argv)
        except USER_ERRORS as error:
            if _debugging():
                raise
            _fail(str(error))

    app.run(guarded_main, flags_parser=_parse_flags)
