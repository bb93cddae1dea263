"""Which config changes a resume allows.

A checkpoint stores its run's config; a run that resumes from it may change only the
`RESUMABLE_FIELDS` (they do not change what the steps compute). Both configs are completed with
the schema's defaults first, so a checkpoint written before a field existed resumes under a
config that holds the field at its default.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import ml_collections

from gdro_jax.configs._schema import complete, is_block, run_schema

# Config fields a resumed run may change: they do not change what the steps compute.
RESUMABLE_FIELDS = (
    "steps",
    "progress",
    "tensorboard",
    "checkpoint",
    "eval",  # an unused block that configs before the schema carried
    "guards",
    "reward_timeout_s",
    "rollout.micro_batch_slots",
    "rollout.batching",  # the same completions, up to float rounding
    "rollout.decode_window",  # likewise
    "rollout.lane_halvings",  # likewise
    "rollout.stop_check_every",  # the same completions
    "rollout.skip_dead_blocks",  # the same completions, up to float rounding
    # How vLLM holds and schedules the work, not what it samples.
    "rollout.vllm.gpu_memory_utilization",
    "rollout.vllm.cpu_kvcache_space_gib",
    "rollout.vllm.max_num_seqs",
    "rollout.vllm.enable_prefix_caching",
    "rollout.vllm.enforce_eager",
    "device_memory_gib",
    # Sums the same gradient in another order: the update up to float32 rounding, not bit for bit.
    "grpo.micro_batch_slots",
    "grpo.logprob_chunk_tokens",
    "grpo.pack_sequences",
    "math.data_dir",
    "math.grader_workers",
    "math.grader_timeout_s",
)


def config_dict(config: Mapping[str, Any]) -> dict[str, Any]:
    """The config as JSON values (tuples become lists), as a checkpoint stores it."""
    if not isinstance(config, ml_collections.ConfigDict):
        config = ml_collections.ConfigDict(config)
    return json.loads(config.to_json_best_effort())


def _flatten(tree: Any, prefix: str = "") -> dict[str, Any]:
    if is_block(tree):
        flat: dict[str, Any] = {}
        for name, value in tree.items():
            flat.update(_flatten(value, f"{prefix}{name}."))
        return flat
    return {prefix[:-1]: tree}


def resumable(name: str) -> bool:
    """True for a dotted field (or one below it) that a resumed run may change."""
    return any(name == f or name.startswith(f + ".") for f in RESUMABLE_FIELDS)


def config_differences(saved: Mapping[str, Any], config: Mapping[str, Any]) -> list[str]:
    """Fields (dotted) whose value differs between a saved config and `config`, each completed
    with the schema's defaults; fields in `RESUMABLE_FIELDS` (and below them) are ignored."""
    schema = run_schema()
    old = _flatten(config_dict(complete(saved, schema)))
    new = _flatten(config_dict(complete(config, schema)))
    return [
        f"{name}: saved {old.get(name, '<absent>')!r}, now {new.get(name, '<absent>')!r}"
        for name in sorted(set(old) | set(new))
        if not resumable(name) and old.get(name, "<absent>") != new.get(name, "<absent>")
    ]


def check_resumable(saved: Mapping[str, Any], config: Mapping[str, Any], where: str) -> None:
    """Raises a ValueError naming every field that makes `config` a different run.

    Args:
      saved: the config stored in a checkpoint (`config_dict` form).
      config: the config of the run that wants to resume from it.
      where: the checkpoint's folder, for the message.
    """
    differences = config_differences(saved, config)
    if differences:
        raise ValueError(
            f"the checkpoint {where} was written by a run with another config; resuming would mix "
            f"two runs. Differing fields: {'; '.join(differences)}. Use a new workdir, or the "
            "saved config (only " + ", ".join(RESUMABLE_FIELDS) + " may change on resume)."
        )
