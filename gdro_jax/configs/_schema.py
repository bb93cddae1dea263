"""The one schema of each config kind: every field, its default and a line saying what it does.

A block is a mapping `name -> Field`. Blocks owned by a library type are read off it, so a
default lives in one place: the GRPO update's from `step.GRPOConfig`, the policy's from
`models.DecoderConfig`, the chain task's from `tasks.ChainTaskConfig`, the math task's from
`tasks.MathTaskConfig`, and each controller part's (`classifier`, `prompt_gdro`,
`rollout_gdro`, any part of `controllers.PARTS`) from its factory's keyword arguments. The
rest (run shape, mesh, checkpoints, optimizer, guards) are written here.

`config_from_schema(schema)` builds a ConfigDict holding every field (None defaults as typed
placeholders, so `--config.rollout.micro_batch_slots=8` parses); `complete(config, schema)` adds
the fields a config leaves out (a saved config from before a field existed, a hand-built one);
`unknown_fields` names the fields a schema does not know, with the nearest valid names.
"""

from __future__ import annotations

import dataclasses
import difflib
import inspect
import re
import types
import typing
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import ml_collections

from gdro_jax import controllers, models, tasks
from gdro_jax.step import GRPOConfig, RolloutConfig, VLLMConfig

_NOT_SET = object()


class Field(NamedTuple):
    """One config field."""

    default: Any
    kind: type  # the value's type (for a None default: what a command-line override parses to)
    help: str  # one line
    # For a field whose default is not what configs written before it existed did: that older
    # behaviour, which `canonical` leaves out instead of the default (so their stamps hold).
    before: Any = _NOT_SET


Block = Mapping[str, Any]  # name -> Field, or name -> Block (a nested block)

# Set by the trainer itself (from the run's shape), so a part's block never carries them.
RUN_LEVEL_ARGUMENTS = controllers.RUN_LEVEL_ARGUMENTS

_ARG_LINE = re.compile(r"^(\s+)(\w+)(?: \([^)]*\))?: (.*)$")


def _documented(docstring: str | None, section: str) -> dict[str, str]:
    """`{name: its description}` (lines joined) of a Google-style `Args:` or `Attributes:`."""
    found: dict[str, str] = {}
    lines = inspect.cleandoc(docstring or "").splitlines()
    inside, indent = False, None
    for line in lines:
        if line.strip() == f"{section}:":
            inside, indent = True, None
            continue
        if not inside:
            continue
        if line.strip() and not line.startswith(" "):
            break  # the next section
        match = _ARG_LINE.match(line)
        if match and (indent is None or len(match[1]) == indent):
            indent, name = len(match[1]), match[2]
            found[name] = match[3].strip()
        elif found and line.strip():  # a continuation line of the last entry
            found[name] += " " + line.strip()
    return found


def _base_type(annotation: Any, default: Any) -> type:
    """The type a field's override parses to: `int | None` -> int, `tuple[...]` -> tuple."""
    if default is not None:
        return type(default)
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        options = [a for a in typing.get_args(annotation) if a is not type(None)]
        annotation = options[0] if options else object
    return typing.get_origin(annotation) or (annotation if isinstance(annotation, type) else object)


def _short(text: str) -> str:
    """The first sentence (or clause before a semicolon) of a description: it ends at a `.` or
    `;` before a space outside brackets, and not at an abbreviation such as "e.g."."""
    first = text
    for match in re.finditer(r"[.;](?=\s)", text):
        head = text[: match.start()]
        inside = len(re.findall(r"[(\[]", head)) > len(re.findall(r"[)\]]", head))  # `(0, 1]` too
        if inside or re.search(r"\b(e\.g|i\.e|cf|vs)$", head):
            continue
        first = head
        break
    return first.rstrip(".;").replace("``", "`")


def from_dataclass(cls, defaults: Mapping[str, Any] | None = None, skip=()) -> dict[str, Field]:
    """The fields of a dataclass with their defaults (or `defaults[name]` for required ones),
    described by the class docstring's `Attributes:` section."""
    hints = typing.get_type_hints(cls)
    docs = _documented(cls.__doc__, "Attributes")
    fields = {}
    for field in dataclasses.fields(cls):
        if field.name in skip:
            continue
        if field.default is not dataclasses.MISSING:
            default = field.default
        elif field.default_factory is not dataclasses.MISSING:
            default = field.default_factory()
        else:
            default = (defaults or {})[field.name]
        kind = _base_type(hints[field.name], default)
        fields[field.name] = Field(default, kind, _short(docs.get(field.name, "")))
    return fields


def from_factory(factory: Callable, skip=RUN_LEVEL_ARGUMENTS) -> dict[str, Field]:
    """The keyword arguments of a factory with their defaults, described by its `Args:`."""
    hints = typing.get_type_hints(factory)
    docs = _documented(factory.__doc__, "Args")
    fields = {}
    for name, parameter in inspect.signature(factory).parameters.items():
        if name in skip or parameter.default is inspect.Parameter.empty:
            continue
        kind = _base_type(hints.get(name), parameter.default)
        fields[name] = Field(parameter.default, kind, _short(docs.get(name, "")))
    return fields


# --- the run config (experiments/configs/tiny_cpu.py, paper_qwen3_*.py) -------------------------

# A random policy's shape by default: the test-sized Qwen3 over the chain task's symbols.
_TINY_POLICY = dataclasses.asdict(models.DecoderConfig.tiny(vocab_size=tasks.VOCAB_SIZE))


def run_schema() -> dict[str, Any]:
    """Every field of an RL run config, by block."""
    parts = {
        name: from_factory(factory)
        for decision in controllers.DECISIONS
        for name, factory in controllers.PARTS[decision].items()
    }
    return {
        "method": Field(
            "grpo", str, f"the training method, one of {', '.join(controllers.METHODS)}"
        ),
        "steps": Field(60, int, "RL steps; raise it to extend a finished run"),
        "seed": Field(0, int, "the prompt order's and the sampling keys' seed"),
        "progress": Field(True, bool, "show a progress bar"),
        "tensorboard": Field(True, bool, "also write TensorBoard events to workdir/tb"),
        "num_prompts": Field(32, int, "N, prompts per step"),
        "n_mean": Field(4, int, "rollouts per prompt on average: R = N * n_mean slots a step"),
        "max_new_tokens": Field(48, int, "M, the most tokens of a completion"),
        "reward_values": Field((-1.0, 1.0), tuple, "(wrong, correct) rewards"),
        "task_kind": Field("chain", str, "chain (the `task` block) or math (the `math` block)"),
        "init_from": Field(
            "", str, "the policy's HF folder (a warm start); empty: a random `model`"
        ),
        "tokenizer": Field("", str, "math: the tokenizer's folder; empty: the one in init_from"),
        "device_memory_gib": Field(
            None, float, "refuse a run whose memory plan exceeds this per device; None: no check"
        ),
        "reward_timeout_s": Field(
            0.0, float, "host rewards: seconds before a hung call stops the run"
        ),
        "rollout": {
            **_rollout_block(),
            "vllm": from_dataclass(VLLMConfig),
        },
        "task": from_dataclass(tasks.ChainTaskConfig),
        "math": from_dataclass(tasks.MathTaskConfig),
        "model": from_dataclass(models.DecoderConfig, defaults=_TINY_POLICY),
        "mesh": _mesh_block(),
        "checkpoint": {
            "enabled": Field(True, bool, "checkpoint into workdir/checkpoints and resume from it"),
            "every_steps": Field(10, int, "save every K steps (and at the last step)"),
            "keep": Field(2, int, "keep the newest N checkpoints"),
            "snapshot_steps": Field(
                (), tuple, "also save the policy after these steps (workdir/snapshots/step_<s>)"
            ),
        },
        "optimizer": optimizer_block(learning_rate=1e-5),
        "grpo": _grpo_block(),
        "guards": {
            "max_consecutive_skips": Field(
                3, int, "stop after this many non-finite steps in a row (0: never)"
            ),
        },
        "classifier": {
            **from_factory(controllers.passk_classifier),
            "bins_from": Field(
                "prompt", str, "prompt: each prompt's own bin; previous_batch: the released code's"
            ),
        },
        **parts,
    }


def _grpo_block() -> dict[str, Field]:
    block = from_dataclass(GRPOConfig)
    # Packing came after the declared study's runs, which were padded (and pin it so).
    block["pack_sequences"] = block["pack_sequences"]._replace(before=False)
    return block


def _rollout_block() -> dict[str, Field]:
    block = from_dataclass(RolloutConfig)
    # Continuous batching came after the declared study's runs, which decoded static chunks.
    block["batching"] = block["batching"]._replace(before="static")
    return block


def _mesh_block() -> dict[str, Field]:
    return {
        "data": Field(1, int, "data-parallel devices (the batch)"),
        "fsdp": Field(1, int, "devices sharding the parameters and the batch"),
        "tensor": Field(1, int, "tensor-parallel devices (heads, MLP width, vocabulary)"),
    }


def optimizer_block(**defaults: Any) -> dict[str, Field]:
    """AdamW with global-norm clipping and a linear warmup (`configs.make_optimizer`)."""
    block = {
        "learning_rate": Field(1e-6, float, "AdamW's learning rate (SPEC 2: 1e-6)"),
        "warmup_steps": Field(0, int, "steps of linear warmup from 0"),
        "b1": Field(0.9, float, "AdamW's beta1"),
        "b2": Field(0.999, float, "AdamW's beta2"),
        "eps": Field(1e-8, float, "AdamW's epsilon"),
        "weight_decay": Field(0.0, float, "decoupled weight decay (0: Adam)"),
        "grad_clip": Field(1.0, float, "global-norm gradient clipping (0: off)"),
    }
    for name, value in defaults.items():
        block[name] = block[name]._replace(default=value)
    return block


# --- the warm start's config (experiments/configs/pretrain_tiny.py) -----------------------------


def pretrain_schema() -> dict[str, Any]:
    """Every field of a warm-start (supervised pretraining) config, by block."""
    return {
        "seed": Field(0, int, "the parameters' initialisation seed"),
        "progress": Field(True, bool, "show progress bars"),
        "task": from_dataclass(tasks.ChainTaskConfig),
        "model": from_dataclass(models.DecoderConfig, defaults=_TINY_POLICY),
        "mesh": _mesh_block(),
        "train": {
            "steps": Field(240, int, "supervised steps"),
            "batch_size": Field(128, int, "rows per step"),
            **optimizer_block(learning_rate=2e-3, warmup_steps=20),
            "end_lr_fraction": Field(
                0.0, float, "the cosine decay ends at this fraction of the rate"
            ),
            "tail_base": Field(1.9, float, "warm-start rows' level shares tail_base^-level"),
            "data_seed": Field(0, int, "the training rows' seed"),
        },
        "eval": {
            "num_samples": Field(8, int, "samples per validation problem"),
            "temperature": Field(1.0, float, "sampling temperature"),
            "top_p": Field(1.0, float, "nucleus filter (1: off)"),
            "top_k": Field(0, int, "top-k filter (0: off)"),
            "batch_size": Field(32, int, "problems per sampler call"),
            "seed": Field(0, int, "the sampling seed"),
        },
        "frontier": {
            "easiest_min_pass1": Field(0.8, float, "the easiest level's pass@1 must exceed this"),
            "hardest_max_pass1": Field(
                0.05, float, "the hardest level's pass@1 must lie in (0, this)"
            ),
        },
    }


# --- building and checking configs ---------------------------------------------------------------


def is_block(value: Any) -> bool:
    """True for a block of fields: a mapping or a ConfigDict (which is not a `Mapping`)."""
    return isinstance(value, Mapping | ml_collections.ConfigDict)


def _plain_dict(block: Any) -> dict[str, Any]:
    return block.to_dict() if isinstance(block, ml_collections.ConfigDict) else dict(block)


def _value(field: Field):
    if field.default is None:
        return ml_collections.config_dict.placeholder(field.kind)
    return field.default


def config_from_schema(schema: Block) -> ml_collections.ConfigDict:
    """A ConfigDict with every field of `schema` at its default."""
    return ml_collections.ConfigDict(
        {
            name: config_from_schema(entry) if isinstance(entry, Mapping) else _value(entry)
            for name, entry in schema.items()
        }
    )


def complete(config: Mapping[str, Any], schema: Block) -> ml_collections.ConfigDict:
    """A copy of `config` with every field of `schema` it leaves out set to its default.

    Fields the schema does not know are kept (`unknown_fields` names them).
    """
    source = _plain_dict(config)
    filled = ml_collections.ConfigDict()
    for name, entry in schema.items():
        if isinstance(entry, Mapping):
            given = source.get(name)
            filled[name] = complete(_plain_dict(given) if is_block(given) else {}, entry)
            if given is not None and not is_block(given):
                filled[name] = given  # not a block: `unknown_fields` does not judge values
        else:
            filled[name] = source[name] if name in source else _value(entry)
    for name, value in source.items():
        if name not in schema:
            filled[name] = value
    return filled


def unknown_fields(config: Mapping[str, Any], schema: Block, prefix: str = "") -> list[str]:
    """One line per field of `config` that `schema` does not know, naming the nearest known
    names (`config.modle: unknown field; did you mean model?`)."""
    problems = []
    for name, value in config.items():
        path = f"{prefix}{name}"
        if name not in schema:
            problems.append(f"config.{path}: unknown field; {nearest(name, schema)}")
        elif isinstance(schema[name], Mapping) and is_block(value):
            problems.extend(unknown_fields(value, schema[name], f"{path}."))
    return problems


def nearest(name: str, known) -> str:
    """`did you mean a, b?` with the known names closest to `name`, or the list of them all."""
    close = difflib.get_close_matches(name, list(known), n=3, cutoff=0.6)
    if close:
        return f"did you mean {' or '.join(close)}?"
    return f"the fields here are {', '.join(sorted(known))}"


def check_known(config: Mapping[str, Any], schema: Block) -> None:
    """Raises a ValueError naming the first field `schema` does not know (and its neighbours)."""
    problems = unknown_fields(config, schema)
    if problems:
        raise ValueError(problems[0])


def canonical(config: Mapping[str, Any], schema: Block) -> dict[str, Any]:
    """The fields of `config` whose values differ from `schema`'s defaults, as plain values.

    Two configs that run the same have the same canonical form, whether a field is left out or
    set to its default; and a field added to the schema later does not change it: at a default
    that keeps the old behaviour, or, where the default changed it, with the old behaviour as
    the field's `before`, which canonical forms take as the default (a config that leaves the
    field out, written before it existed, ran that way). Hashes and study stamps are taken over
    it.
    """
    schema = _as_before(schema)  # a field left out means what configs without it did
    completed = complete(config, schema).to_dict()

    def strip(values: Mapping[str, Any], block: Block) -> dict[str, Any]:
        kept = {}
        for name, value in values.items():
            entry = block.get(name)
            if isinstance(entry, Mapping) and isinstance(value, Mapping):
                inner = strip(value, entry)
                if inner:
                    kept[name] = inner
            elif not isinstance(entry, Field) or _plain(value) != _plain(entry.default):
                kept[name] = value
        return kept

    return strip(completed, schema)


def _as_before(schema: Block) -> Block:
    """`schema` with each field that has a `before` value defaulting to it."""
    return {
        name: _as_before(entry)
        if isinstance(entry, Mapping)
        else entry
        if entry.before is _NOT_SET
        else entry._replace(default=entry.before)
        for name, entry in schema.items()
    }


def _plain(value: Any) -> Any:
    """Tuples as lists, so a default compares equal to its value read back from JSON."""
    if isinstance(value, tuple | list):
        return [_plain(v) for v in value]
    return value


def describe(schema: Block, prefix: str = "") -> list[tuple[str, Any, str]]:
    """`(dotted name, default, help)` of every field, block by block (for help texts)."""
    rows = []
    for name, entry in schema.items():
        if isinstance(entry, Mapping):
            rows.extend(describe(entry, f"{prefix}{name}."))
        else:
            rows.append((f"{prefix}{name}", entry.default, entry.help))
    return rows
