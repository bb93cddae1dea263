"""What a run needs from the machine, one copy each: joining several processes, who writes, and
the collectives between processes. (The mesh convention, `data` x `fsdp` x `tensor` with None
for one device, is `gdro_jax.models`': the decoder, below this layer, places itself on it.)

- `initialize`: connects the processes of a multi-process run (flags, SLURM, TPU slices).
- `is_primary`, `global_array`, `replicate`, `to_host`, `agreed_signal`,
  `broadcast_from_primary`, `from_primary`, `gather`: plain local operations with one process.
- `notice`, `logging_above_bars`: lines for a person printed above progress bars, not inside;
  `COMPILING_NOTE` on a bar until its first step is done.
- `environment`: the machine and software a result was made with (versions, backend, devices,
  the CPU and its vector extensions), recorded in every result file; `cpu_description`.
- `check_writable_folder`: an output folder's pre-flight check; `use_compilation_cache`: jax's
  persistent compilation cache under the user's cache folder (`compilation_cache_dir`,
  `$GDRO_COMPILATION_CACHE`).
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
from gdro_jax.runtime._console import COMPILING_NOTE, logging_above_bars, notice
from gdro_jax.runtime._distributed import initialize
from gdro_jax.runtime._environment import cpu_description, environment
from gdro_jax.runtime._folders import (
    CACHE_ENV,
    check_writable_folder,
    compilation_cache_dir,
    use_compilation_cache,
)

__all__ = [
    "CACHE_ENV",
    "COMPILING_NOTE",
    "agreed_signal",
    "broadcast_from_primary",
    "check_writable_folder",
    "compilation_cache_dir",
    "cpu_description",
    "environment",
    "from_primary",
    "gather",
    "global_array",
    "initialize",
    "is_primary",
    "logging_above_bars",
    "notice",
    "replicate",
    "to_host",
    "use_compilation_cache",
]
