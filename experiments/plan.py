"""The memory plan of a training run: what each device holds, worked out without allocating.

    python -m experiments.plan --config=experiments/configs/paper_qwen3_8b.py \
        --config.mesh.fsdp=8 --config.device_memory_gib=80

Prints a table per device (parameters, AdamW moments, the KL reference, the rollout's KV cache
and other buffers, the update's temporaries, the total and the budget) from `jax.eval_shape` and
the compiled rollout and update (`gdro_jax.planner.memory_plan`). With `device_memory_gib` set it
also searches the largest `rollout.micro_batch_slots` and `grpo.micro_batch_slots` that fit, and
exits with status 1 and a line naming the knob to turn when the plan does not fit.

On a machine with fewer devices than the mesh (a CPU) the plan runs on fake CPU devices: this
entry point sets `XLA_FLAGS=--xla_force_host_platform_device_count=<data x fsdp x tensor>`
before jax starts its backends (jax reads it then, not at import), so no flag is needed.
`JAX_PLATFORMS=cpu` plans on the CPU on a machine with accelerators too.
"""

import json
import math
import os
import pathlib
import sys

from absl import flags
from ml_collections import config_flags

from experiments import _cli
from gdro_jax import configs, planner

_CONFIG = config_flags.DEFINE_config_file("config", None, "Training config file.")
_OUT = flags.DEFINE_string(
    "out", None, "Optional folder to keep the plan in (plan.txt, plan.json)."
)
_DEVICE_COUNT = "--xla_force_host_platform_device_count"


def _fake_cpu_devices(count: int) -> None:
    """Asks XLA:CPU for `count` devices; takes effect if no jax backend has started yet."""
    kept = [f for f in os.environ.get("XLA_FLAGS", "").split() if not f.startswith(_DEVICE_COUNT)]
    os.environ["XLA_FLAGS"] = " ".join([*kept, f"{_DEVICE_COUNT}={count}"])


def main(argv):
    del argv
    config = _CONFIG.value
    sizes = [config.mesh[axis] for axis in ("data", "fsdp", "tensor")]
    if all(isinstance(size, int) and size > 0 for size in sizes):  # else the plan names the field
        _fake_cpu_devices(math.prod(sizes))
    plan = planner.memory_plan(config, planner.planning_mesh(config), suggest=True)
    print(plan.table())
    if _OUT.value:
        out = pathlib.Path(_OUT.value)
        out.mkdir(parents=True, exist_ok=True)
        (out / "plan.txt").write_text(plan.table() + "\n")
        record = {**plan._asdict(), "total": plan.total, "fits": plan.fits}
        (out / "plan.json").write_text(json.dumps(record, indent=2, default=list) + "\n")
        files = {"plan.txt": "the table above", "plan.json": "every line in bytes"}
        print(_cli.wrote(out, files))
    else:
        print("Nothing written: the plan is the table above (--out=DIR keeps it in DIR).")
    if not plan.fits:
        print(f"error: {plan.error()}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    _cli.run(main, required=("config",), schemas={"": configs.run_schema})
