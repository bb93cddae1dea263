"""`--help` of every entry point: a usage line with one real example, the entry point's own flags,
and its config's fields with their defaults and a line of help each, read from the config schema.

absl's `--help` lists only the main module's flags, without a config field; `--helpfull` lists
every flag of every library (absltest's, chex's, grain's), and stays as it is. The fields come
from the `--config` file given on the command line (its values are the defaults shown), else from
the schema; each field's help is the schema's. Blocks a run does not use (the parts of other
methods, the `math` block of a chain run) are listed compactly, `name=default` only, so that
the whole list fits a screenful or two.
"""

from __future__ import annotations

import sys
import textwrap
from collections.abc import Callable, Mapping
from typing import Any

from absl import flags

from gdro_jax import configs, controllers

# The multi-process flags' heading in `--helpfull` and here (`_cli.define_process_flags`).
PROCESS_FLAGS = "several processes (hosts)"
WIDTH = 100


def example_command(doc: str | None) -> str | None:
    """The first `python -m ...` command of a module docstring, its line continuations joined."""
    lines = (doc or "").splitlines()
    for index, line in enumerate(lines):
        if line.strip().startswith("python -m "):
            parts = [line.strip()]
            while parts[-1].endswith("\\") and index + 1 < len(lines):
                index += 1
                parts[-1] = parts[-1][:-1].rstrip()
                parts.append(lines[index].strip())
            return " ".join(" ".join(parts).split())  # a `\` ending a docstring line joins it
    return None


def _summary(doc: str | None) -> str:
    """The docstring's first paragraph, on one line."""
    first = (doc or "").strip().split("\n\n")[0]
    return " ".join(first.split())


def _format_value(value: Any) -> str:
    if isinstance(value, str):
        return repr(value) if value == "" or " " in value else value
    if isinstance(value, tuple | list):
        return (
            "(" + ",".join(_format_value(v) for v in value) + ("," if len(value) == 1 else "") + ")"
        )
    return str(value)


def _leaves(config: Mapping[str, Any], prefix: str = "") -> list[tuple[str, Any]]:
    rows = []
    for name, value in config.items():
        if hasattr(value, "items"):
            rows.extend(_leaves(value, f"{prefix}{name}."))
        else:
            rows.append((f"{prefix}{name}", value))
    return rows


def descriptions(schemas: Mapping[str, Callable[[], Mapping[str, Any]]]) -> dict[str, str]:
    """`{dotted field: its help}` from schemas mounted at prefixes (`""`: the whole config;
    `"train."`: a study config's `train` block)."""
    out = {}
    for prefix, schema in schemas.items():
        for name, _, text in configs.describe(schema(), prefix):
            out[name] = text
    return out


def _unused_blocks(config: Mapping[str, Any]) -> dict[str, str]:
    """`{block: the setting that would use it}` for the blocks of a run config that its
    method, task kind and rollout engine do not read (`rollout.vllm` for a sub-block)."""
    method = config.get("method")
    if not isinstance(method, str) or method not in controllers.METHODS:
        return {}
    used = set(controllers.get_method(method).parts().values())
    parts = {name for options in controllers.PARTS.values() for name in options}
    unused = dict.fromkeys(parts - used, "another method")
    if config.get("task_kind", "chain") == "chain":
        unused["math"] = "task_kind=math"
    else:
        unused["task"] = "task_kind=chain"
    rollout = config.get("rollout")
    if hasattr(rollout, "items") and "vllm" in rollout and rollout.get("engine") != "vllm":
        unused["rollout.vllm"] = "engine=vllm"
    return {block: why for block, why in unused.items() if block.split(".")[0] in config}


def config_lines(
    config: Mapping[str, Any],
    helps: Mapping[str, str],
    *,
    prefix: str = "",
    width: int = WIDTH,
) -> list[str]:
    """Every field of `config` (`<field>=<default>  help`, a block's fields under its name, so
    `--config.<block>.<field>`), top-level fields first, then block by block; blocks (and
    sub-blocks) the run does not use are packed, `name=default` only."""
    lines: list[str] = []
    top = [(name, value) for name, value in config.items() if not hasattr(value, "items")]
    blocks = [(name, value) for name, value in config.items() if hasattr(value, "items")]
    unused = _unused_blocks(config)

    def field_lines(name: str, value: Any, indent: str, shown: str) -> list[str]:
        """`shown=default  help`, the help wrapped at its own column when it is long."""
        left = f"{indent}{shown}={_format_value(value)}"
        text = helps.get(f"{prefix}{name}", "")
        if not text:
            return [left]
        column = max(len(left) + 2, 30)
        return textwrap.wrap(
            text,
            width=width,
            initial_indent=left.ljust(column),
            subsequent_indent=" " * column,
            break_on_hyphens=False,
        )

    def packed_lines(block: str, leaves: list[tuple[str, Any]], indent: str) -> list[str]:
        """`<name> (used with ...): field=default ...`, wrapped, for an unused (sub-)block."""
        packed = " ".join(f"{n.removeprefix(block + '.')}={_format_value(v)}" for n, v in leaves)
        head = f"{indent}{block.rsplit('.', 1)[-1]} (used with {unused[block]}): "
        return textwrap.wrap(
            packed, width=width, initial_indent=head, subsequent_indent=indent + "    "
        )

    for name, value in top:
        lines.extend(field_lines(name, value, "  ", name))
    for block, values in blocks:
        leaves = _leaves(values, f"{block}.")
        if block in unused:
            lines.extend(packed_lines(block, leaves, "  "))
            continue
        lines.append(f"  {block}:")
        inner = [b for b in unused if b.startswith(f"{block}.")]
        for name, value in leaves:
            if not any(name.startswith(f"{b}.") for b in inner):
                lines.extend(field_lines(name, value, "    ", name.split(".", 1)[1]))
        for sub in inner:
            lines.extend(
                packed_lines(sub, [(n, v) for n, v in leaves if n.startswith(f"{sub}.")], "    ")
            )
    return lines


def _own_flags(main_module: str, required) -> list[str]:
    """The entry point's flags, one per line, then the multi-process flags on one line (their
    help is in `--helpfull`, under the same heading)."""
    by_module = flags.FLAGS.flags_by_module_dict()
    lines = ["flags:"]
    for flag in sorted(by_module.get(main_module, []), key=lambda f: f.name):
        default = "" if flag.default is None else f" (default: {_format_value(flag.default)})"
        needed = " (required)" if flag.name in required else ""
        text = f"  --{flag.name}  {flag.help}{needed or default}"
        lines.extend(textwrap.wrap(text, width=WIDTH, subsequent_indent="      "))
    shared = sorted(f.name for f in by_module.get(PROCESS_FLAGS, []))
    if shared:
        names = ", ".join(f"--{name}" for name in shared)
        lines.append(f"{PROCESS_FLAGS}: {names} (docs/scaling.md)")
    return lines


def help_text(
    doc: str | None,
    *,
    required=(),
    config: Mapping[str, Any] | None = None,
    config_file: str | None = None,
    schemas: Mapping[str, Callable[[], Mapping[str, Any]]] | None = None,
) -> str:
    """The whole `--help` text of the running entry point (see the module docstring): `doc` is
    its docstring, `required` its required flags, `config` the loaded `--config` (None: none
    given, or the entry point has none), `schemas` where its config's field helps come from."""
    module = program_name()
    program = f"python -m {module}" if module else sys.argv[0]
    example = example_command(doc)
    usage = " ".join(f"--{name}=..." for name in required) or "[--flag=value ...]"
    if schemas:
        usage += " [--config.<field>=<value> ...]"
    lines = [f"usage: {program} {usage}"]
    if example:
        lines.append(f"example: {example}")
    lines += ["", *textwrap.wrap(_summary(doc), width=WIDTH), ""]
    lines += _own_flags(sys.argv[0], set(required))
    if config is not None:
        where = f"the defaults of {config_file}" if config_file else "the schema's defaults"
        lines += [
            "",
            f"config fields (--config.<field>=<value>; {where}):",
            *config_lines(config, descriptions(schemas or {})),
        ]
    elif schemas:
        lines += ["", "config fields: give --config=<file> to list them with that file's values"]
    lines += ["", "--helpfull: every flag, absl's and the libraries' included."]
    return "\n".join(lines)


def program_name() -> str:
    """`experiments.train` for `python -m experiments.train` (the __main__ module's spec)."""
    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    return spec.name if spec is not None and spec.name else ""
