"""What a run needs from the machine, one copy each: joining several processes, who writes, the
collectives between processes, and the mesh convention.

- `initialize`: connects the processes of a multi-process run (flags, SLURM, TPU slices).
- `is_primary`, `global_array`, `replicate`, `to_host`, `agreed_signal`,
  `broadcast_from_primary`, `from_primary`, `gather`: plain local operations with one process.
- `run_mesh`, `mesh_shape`, `batch_sharding`, `constrain_batch`: `data` x `fsdp` x `tensor`
  meshes, None for one device; batches on `data` x `fsdp`.
- `notice`, `logging_above_bars`: lines for a person printed above progress bars, not inside.
"""

from gdro_jax.runtime._collectives import (
    agreed_signal,
    broadcast_from_primary,
    from_primary,
    gather,
    global_array,
    is_primary,
    replicate,
    to_host,
)
from gdro_jax.runtime._console import logging_above_bars, notice
from gdro_jax.runtime._distributed import initialize
from gdro_jax.runtime._meshes import batch_sharding, constrain_batch, mesh_shape, run_mesh

__all__ = [
    "agreed_signal",
    "batch_sharding",
    "broadcast_from_primary",
    "constrain_batch",
    "from_primary",
    "gather",
    "global_array",
    "initialize",
    "is_primary",
    "logging_above_bars",
    "mesh_shape",
    "notice",
    "replicate",
    "run_mesh",
    "to_host",
]
