"""Multi-host start-up: join `jax.distributed`, move arrays between host and global device
arrays, process-0 helpers.

JAX's multi-controller model: every host runs the same `launch/train.py`; `jax.distributed`
joins them and `jax.devices()` then lists every chip of the slice. The device programs (sampler,
train step) are SPMD over the global mesh. The host program is replicated: every process runs
the whole host loop on the same host data (same seeds, same gathered tokens), so all processes
make the same decisions and feed the same batches to the device. The Agent's episodes are the
exception: each host runs the environments of its own rows in its own sandbox pool and the hosts
exchange the results (`allgather_json`, `spade.envrunner.ShardedEnvRunner`), so environment
execution scales with the number of hosts; the validation gate divides the Designer's candidates
among the hosts the same way (`map_over_processes`). Only process 0 writes host files (memory,
env files, metrics); every process takes part in checkpointing.

Crossing the host/device boundary with global arrays:
  - host -> device: `jax.device_put(numpy_value, sharding)`; with identical host data on every
    process it builds the global array from each process's addressable shards. (Plain numpy
    arguments to a jit with a sharded `in_shardings` are refused in a multi-process run;
    replicated ones, e.g. scalars, are fine.)
  - device -> host: `to_host(array)`; plain `np.asarray` fails on an array that spans devices of
    other processes unless it is fully replicated.
"""

from __future__ import annotations

import dataclasses
import enum
import hashlib
import json
import logging
import os
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np
from jax.experimental import multihost_utils

_initialized = False


@dataclasses.dataclass(frozen=True)
class DetectedCluster:
    """A cluster environment JAX recognises here (`jax._src.clusters`) and its process count;
    `method` is its `cluster_detection_method` name for `jax.distributed.initialize` (None for
    the ones JAX leaves unnamed)."""

    name: str
    process_count: int
    method: str | None = None


class Startup(enum.StrEnum):
    """How this process joins a run: at a given coordinator, through the cluster JAX detected,
    or alone (no `jax.distributed` initialisation)."""

    EXPLICIT = "explicit"
    AUTO = "auto"
    SINGLE = "single"

    def join(self, coordinator: str | None, num_processes: int | None,
             process_id: int | None, detected: DetectedCluster | None) -> bool:
        """Initialise `jax.distributed` this way; whether a multi-process run was joined."""
        if self is Startup.EXPLICIT:
            jax.distributed.initialize(coordinator, num_processes, process_id)
        elif self is Startup.AUTO:
            jax.distributed.initialize(cluster_detection_method=detected.method)
        return self is not Startup.SINGLE


@dataclasses.dataclass(frozen=True)
class StartupDecision:
    """How this process starts, and `reason`, the log line saying why."""

    action: Startup
    reason: str


def detect_cluster(cluster_types: Sequence | None = None) -> DetectedCluster | None:
    """The first cluster environment JAX's own auto-detection would pick, or None.

    Same order and rule as `jax.distributed.initialize()`: the first `ClusterEnv` subclass
    that is not opt-in only and whose `is_env_present()` is true (GCE TPU VMs via the metadata
    server, GKE TPU via TPU_WORKER_HOSTNAMES/TPU_PROCESS_ADDRESSES, SLURM, Open MPI,
    Kubernetes). `cluster_types` stands in for JAX's list in tests.
    """
    if cluster_types is None:
        from jax._src import clusters

        cluster_types = clusters.ClusterEnv._cluster_types
    for env in cluster_types:
        if env.opt_in_only_method or not env.is_env_present():
            continue
        name = env.__name__
        try:
            count = env.get_process_count()
        except Exception as err:  # a TPU VM whose metadata server does not answer, ...
            raise RuntimeError(f"JAX detected cluster {name!r} but could not read its process "
                               f"count: {type(err).__name__}: {err}") from err
        return DetectedCluster(name, int(count), env.name or None)
    return None


def decide_startup(coordinator: str | None, detected: DetectedCluster | None) -> StartupDecision:
    """Whether and how to join `jax.distributed` (pure: the inputs are what was detected).

    An explicit coordinator always wins; otherwise a detected cluster of more than one process
    is joined the way JAX detects it; a single process (a one-host TPU VM, a laptop) starts
    alone, exactly as without `jax.distributed`.
    """
    if coordinator:
        return StartupDecision(Startup.EXPLICIT,
                               f"coordinator {coordinator} given (SPADE_COORDINATOR)")
    if detected is None:
        return StartupDecision(Startup.SINGLE, "no cluster environment detected: one process")
    if detected.process_count > 1:
        return StartupDecision(Startup.AUTO, f"cluster {detected.name!r} detected with "
                                             f"{detected.process_count} processes")
    return StartupDecision(
        Startup.SINGLE, f"cluster {detected.name!r} detected with 1 process: no initialisation")


def initialize_from_environment(
    coordinator: str | None = None, num_processes: int | None = None, process_id: int | None = None
) -> None:
    """Join a multi-process run when the environment says there is one; no-op on one process.

    Sources, in order: explicit arguments; SPADE_COORDINATOR / SPADE_NUM_PROCESSES /
    SPADE_PROCESS_ID; JAX's own cluster detection (`detect_cluster`), where
    `jax.distributed.initialize()` then discovers coordinator and process ids itself.
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
    detected = None if coordinator else detect_cluster()
    decision = decide_startup(coordinator, detected)
    logging.info("multi-host start-up: %s", decision.reason)
    if not decision.action.join(coordinator, num_processes, process_id, detected):
        return
    _initialized = True
    logging.info(
        "joined distributed run: process %d of %d, %d global devices",
        jax.process_index(), jax.process_count(), jax.device_count(),
    )


def is_main_process() -> bool:
    """True on the process that writes host files (process 0)."""
    return jax.process_index() == 0


def to_host(x) -> np.ndarray:
    """The global value of a device array as a numpy array, on every process.

    One process, or an array this process holds all of (fully addressable or fully replicated):
    `np.asarray`. Otherwise an all-gather across processes (a collective: every process must
    call it, in the same order, which the replicated host program guarantees).
    """
    if isinstance(x, jax.Array) and not (x.is_fully_addressable or x.is_fully_replicated):
        return np.asarray(multihost_utils.process_allgather(x, tiled=True))
    return np.asarray(x)


def allgather_json(value) -> list:
    """Every process's JSON-serialisable `value`, in process order, on every process.

    How hosts share host data (e.g. the results of the environments each one ran): two small
    all-gathers, of the byte lengths and of the padded UTF-8 JSON bytes. One process: `[value]`.
    """
    if jax.process_count() == 1:
        return [value]
    data = np.frombuffer(json.dumps(value).encode(), np.uint8)
    sizes = np.asarray(multihost_utils.process_allgather(np.array([data.size], np.int32)))
    sizes = sizes.reshape(-1)
    padded = np.zeros(int(sizes.max()), np.uint8)
    padded[:data.size] = data
    rows = np.asarray(multihost_utils.process_allgather(padded)).reshape(len(sizes), -1)
    return [json.loads(row[:n].tobytes().decode()) for row, n in zip(rows, sizes, strict=True)]


def merge_across_processes(mine: dict[int, Any], gather=allgather_json) -> dict[int, Any]:
    """The union of every process's `mine` (JSON values keyed by a run-wide integer index).

    How a process learns the results of the work the other processes did (each index is owned
    by exactly one process). `gather` stands in for `allgather_json` in tests.
    """
    merged: dict[int, Any] = {}
    for part in gather({str(k): v for k, v in mine.items()}):
        merged.update({int(k): v for k, v in part.items()})
    return merged


def map_over_processes(fn: Callable[[Any], Any], items: Sequence, *, encode: Callable,
                       decode: Callable, process_index: int | None = None,
                       process_count: int | None = None, gather=allgather_json) -> list:
    """`[fn(x) for x in items]`, with item i computed only by process i % process_count.

    For host work the replicated host loop needs on every process but that need only run once,
    such as validating the Designer's candidates. Results travel as JSON (`encode` to it,
    `decode` back), so every process returns the same list. One process: a plain map.
    """
    index = jax.process_index() if process_index is None else process_index
    count = jax.process_count() if process_count is None else process_count
    if count == 1:
        return [fn(x) for x in items]
    mine = {i: encode(fn(items[i])) for i in range(index, len(items), count)}
    merged = merge_across_processes(mine, gather)
    return [decode(merged[i]) for i in range(len(items))]


def assert_same_on_all_processes(arrays: dict[str, np.ndarray], what: str) -> None:
    """Fail loudly if the processes' host programs diverged (no-op on one process).

    The replicated host program relies on every process computing the same host data; host
    decisions that depend on wall-clock time (sandbox call timeouts, the validation liveness
    budget) could in principle differ between processes and would otherwise go unnoticed.
    Compares a SHA-256 of `arrays` (names, dtypes, shapes, bytes), so the check is one tiny
    all-gather whatever their size.
    """
    if jax.process_count() == 1:
        return
    digest = hashlib.sha256()
    for name in sorted(arrays):
        value = np.ascontiguousarray(arrays[name])
        digest.update(f"{name}:{value.dtype}:{value.shape}".encode())
        digest.update(value.tobytes())
    fingerprint = np.frombuffer(digest.digest(), np.uint32)
    multihost_utils.assert_equal(fingerprint, f"{what} differs between processes")
