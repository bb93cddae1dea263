"""Joining a run of several processes: JAX's multi-controller runtime (a process per host or GPU).

Every process runs the same program on its own devices; `jax.distributed.initialize` connects
them, and a mesh built from `jax.devices()` then spans all of them. The trainer keeps every
decision identical across processes by construction:

    prompts      every process draws the same seeded batch of prompt ids (replicated)
    controllers  their states are replicated arrays, updated inside the jitted step
    rollouts     slots are sharded over the batch axes; each process samples its own slots
    rewards      device rewards run inside jit; host rewards grade each process's own slots
    writes       metrics, TensorBoard, config/summary and the exported model: process 0 only;
                 orbax checkpoints are saved and restored by all processes together

A stop request (SIGTERM on one host) is agreed on by all processes at the end of each step, so
they checkpoint the same step and exit together.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import jax


def _cluster_detected(environ: dict[str, str]) -> bool:
    """True when the environment is a multi-process SLURM job or a multi-host TPU slice."""
    if "SLURM_JOB_ID" in environ and int(environ.get("SLURM_NTASKS", "1")) > 1:
        return True
    if "," in environ.get("TPU_WORKER_HOSTNAMES", ""):
        return True
    return "MEGASCALE_COORDINATOR_ADDRESS" in environ


def initialize(
    coordinator_address: str | None = None,
    num_processes: int | None = None,
    process_id: int | None = None,
    *,
    auto: bool = False,
    environ: dict[str, str] | None = None,
    initialize_fn: Callable[..., Any] | None = None,
) -> bool:
    """Connects this process to the others of a multi-process run, or does nothing.

    Explicit: all three of `coordinator_address` (`host:port` of process 0), `num_processes`
    and `process_id`. Automatic: none of them, and either `auto` or an environment that names
    several processes (a SLURM job with several tasks, a GKE TPU slice's `TPU_WORKER_HOSTNAMES`);
    then `jax.distributed.initialize()` reads the cluster itself (SLURM, Open MPI, Cloud TPU
    VMs through their metadata, GKE). Otherwise (one process) nothing happens. On CPU the gloo
    collectives are selected.

    Must run before anything touches a JAX device.

    Args:
      coordinator_address: process 0's `host:port`.
      num_processes: number of processes in the run.
      process_id: this process's index, in `[0, num_processes)`.
      auto: let JAX detect the cluster even where the environment check above does not (e.g.
        a Cloud TPU VM slice started with `gcloud ... ssh --worker=all`).
      environ: the environment to inspect (default `os.environ`; for tests).
      initialize_fn: what connects (default: gloo for CPUs, then `jax.distributed.initialize`;
        for tests).

    Returns:
      True when the process joined a multi-process run.

    Raises:
      ValueError: only some of the three flags are given, or they are inconsistent.
    """
    environ = os.environ if environ is None else environ
    initialize_fn = _connect if initialize_fn is None else initialize_fn
    given = {
        "coordinator_address": coordinator_address,
        "num_processes": num_processes,
        "process_id": process_id,
    }
    missing = [name for name, value in given.items() if value in (None, "")]
    if len(missing) == len(given):
        if not (auto or _cluster_detected(environ)):
            return False
        initialize_fn()
        return True
    if missing or auto:
        if auto:
            raise ValueError(
                "--distributed lets JAX detect the cluster; do not also pass "
                "--coordinator_address, --num_processes or --process_id"
            )
        raise ValueError(
            f"a multi-process run needs --coordinator_address, --num_processes and --process_id "
            f"together; missing --{', --'.join(missing)}"
        )
    if num_processes < 1 or not 0 <= process_id < num_processes:
        raise ValueError(
            f"--process_id must be in [0, --num_processes={num_processes}), got {process_id}"
        )
    if num_processes == 1:
        return False
    initialize_fn(
        coordinator_address=coordinator_address,
        num_processes=num_processes,
        process_id=process_id,
    )
    return True


def _connect(**kwargs) -> None:
    # CPU devices of different processes talk through gloo; GPUs (NCCL) and TPUs (ICI/DCN)
    # have their own, which this setting does not touch.
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(**kwargs)
