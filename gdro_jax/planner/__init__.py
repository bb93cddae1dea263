"""The memory plan of a training step: bytes per device, worked out before anything is allocated.

`memory_plan(config, mesh)` gives the persistent state (parameters, AdamW moments, the KL
reference) from `jax.eval_shape`, the rollout's KV cache by hand, and the rollout's and the
update's other buffers from `memory_analysis()` of the step's own phases (`gdro_jax.step`),
compiled on zero-sized arguments (`jax.ShapeDtypeStruct`s) at full depth. `check_memory_plan`
is what `build_run` calls when `config.device_memory_gib` is set; `planning_mesh` makes the
run's mesh out of fake CPU devices where a machine has fewer.
"""

from gdro_jax.planner._plan import (
    GIB,
    MemoryPlan,
    check_memory_plan,
    format_size,
    memory_plan,
    planning_mesh,
)
from gdro_jax.planner._planner import Planner, bytes_per_device

__all__ = [
    "GIB",
    "MemoryPlan",
    "Planner",
    "bytes_per_device",
    "check_memory_plan",
    "format_size",
    "memory_plan",
    "planning_mesh",
]
