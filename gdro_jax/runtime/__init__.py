"""What a run needs from the machine, one copy each: joining several processes, who writes, and
the collectives between processes. (The mesh convention, `data` x `fsdp` x `tensor` with None
for one device, is `gdro_jax.models`': the decoder, below this layer, places itself on it.)

- `initialize`: connects the processes of a multi-process run (flags, SLURM, TPU slices).
- `is_primary`, `global_array`, `replicate`, `to_host`, `agreed_signal`,
  `broadcast_from_primary`, `from_primary`, `gather`: plain local operations with one process.
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

__all__ = [
    "agreed_signal",
    "broadcast_from_primary",
    "from_primary",
    "gather",
    "global_array",
    "initialize",
    "is_primary",
    "logging_above_bars",
    "notice",
    "replicate",
    "to_host",
]
