"""Multi-host start-up: join `jax.distributed`, build the global mesh, process-0 helpers.

JAX's multi-controller model: every host runs the same `launch/train.py`; `jax.distributed`
joins them and `jax.devices()` then lists every chip of the slice. Each host samples and runs the
environments of its own shard of the batch; only process 0 writes host files (memory, env files,
metrics); every process takes part in checkpointing.
"""

from __future__ import annotations

import logging
import os

import jax

_initialized = False


def initialize_from_environment(
    coordinator: str | None = None, num_processes: int | None = None, process_id: int | None = None
) -> None:
    """Join a multi-process run when the environment says there is one; no-op on one host.

    Sources, in order: explicit arguments; SPADE_COORDINATOR / SPADE_NUM_PROCESSES /
    SPADE_PROCESS_ID; SLURM (SLURM_NTASKS > 1) and TPU VM slices (TPU_WORKER_HOSTNAMES with
    more than one host), where `jax.distributed.initialize()` discovers everything itself.
    """
    global _initialized
    if _initialized:
        return
    coordinator = coordinator or os.environ.get("SPADE_COORDINATOR")
    if num_processes is None and "SPADE_NUM_PROCESSES" in os.environ:
        num_processes = int(os.environ["SPADE_NUM_PROCESSES"])
    if process_id is None and "SPADE_PROCESS_ID" in os.environ:
        process_id = int(os.environ["SPADE_PROCESS_ID"])
    if os.environ.get("SPADE_CPU_COLLECTIVES"):
        jax.config.update("jax_cpu_collectives_implementation", os.environ["SPADE_CPU_COLLECTIVES"])
    if coordinator:
        jax.distributed.initialize(coordinator, num_processes, process_id)
    elif int(os.environ.get("SLURM_NTASKS", "1")) > 1 or _is_multi_host_tpu():
        jax.distributed.initialize()
    else:
        return
    _initialized = True
    logging.info(
        "joined distributed run: process %d of %d, %d global devices",
        jax.process_index(), jax.process_count(), jax.device_count(),
    )


def _is_multi_host_tpu() -> bool:
    hosts = os.environ.get("TPU_WORKER_HOSTNAMES", "")
    return len([h for h in hosts.split(",") if h]) > 1


def is_main_process() -> bool:
    """True on the process that writes host files (process 0)."""
    return jax.process_index() == 0
