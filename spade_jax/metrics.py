"""Run metrics: `metrics.jsonl` and TensorBoard events in the workdir (and Weights & Biases
when asked), phase timers, progress.

Only process 0 writes host files in a multi-host run; the others get a writer that drops
everything, so callers never need to check the process index.
"""

from __future__ import annotations

import contextlib
import json
import math
import tempfile
import time
import uuid
from collections import defaultdict

import numpy as np
from etils import epath

from spade_jax.event_file import ScalarEventWriter
from spade_jax.workdir import is_remote, open_append

WANDB_INSTALL = "pip install -e .[wandb]"
WANDB_ID_FILE = "wandb_run_id"  # in the workdir: a resumed run logs to the same W&B run


class MetricsWriter:
    """Append scalar metrics per cycle to `metrics.jsonl` and TensorBoard event files, and to
    a Weights & Biases run when `logging.wandb` (a `config.LoggingConfig`)."""

    def __init__(self, workdir: str, *, enabled: bool = True, logging=None,
                 config: dict | None = None):
        self.enabled = enabled
        self._jsonl = None
        self._tb = None
        self._wandb = None
        if not enabled:
            return
        directory = epath.Path(workdir)
        directory.mkdir(parents=True, exist_ok=True)
        self._jsonl = open_append(directory / "metrics.jsonl")
        self._tb = ScalarEventWriter(directory / "tensorboard")
        if logging is not None and logging.wandb:
            self._wandb = _start_wandb(directory, logging, config or {})

    def write(self, step: int, metrics: dict[str, float]) -> None:
        """Record `metrics` for `step`; non-finite values are kept in JSON as null."""
        if not self.enabled:
            return
        clean = {k: _to_float(v) for k, v in metrics.items()}
        record = {"cycle": step, "time": time.time(), **clean}
        self._jsonl.write(json.dumps(record, sort_keys=True) + "\n")
        self._jsonl.flush()
        finite = {k: v for k, v in clean.items() if v is not None}
        self._tb.write(step, finite)
        self._tb.flush()
        if self._wandb is not None:
            self._wandb.log(finite, step=step)

    def close(self) -> None:
        if self._jsonl:
            self._jsonl.close()
        if self._tb:
            self._tb.close()
        if self._wandb is not None:
            self._wandb.finish()
            self._wandb = None


def _start_wandb(directory: epath.Path, logging, config: dict):
    """A W&B run for this workdir: the one its `WANDB_ID_FILE` names (resumed), else a new one
    whose id is written there. Local files go under the workdir (a temp dir for gs://)."""
    try:
        import wandb
    except ImportError as error:
        raise ImportError(f"logging.wandb=True needs wandb: {WANDB_INSTALL}") from error
    id_file = directory / WANDB_ID_FILE
    run_id = id_file.read_text().strip() if id_file.exists() else uuid.uuid4().hex[:12]
    if not id_file.exists():
        id_file.write_text(run_id + "\n")
    local = tempfile.mkdtemp(prefix="wandb_") if is_remote(str(directory)) else str(directory)
    return wandb.init(project=logging.wandb_project, entity=logging.wandb_entity or None,
                      id=run_id, resume="allow", dir=local, name=directory.name,
                      config=config)


def _to_float(value) -> float | None:
    value = float(np.asarray(value))
    return value if math.isfinite(value) else None


class PhaseTimer:
    """Wall time spent per named phase (sampling, env execution, training, ...) in a cycle."""

    def __init__(self):
        self.seconds: dict[str, float] = defaultdict(float)
        self._start = time.perf_counter()

    @contextlib.contextmanager
    def phase(self, name: str):
        start = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[name] += time.perf_counter() - start

    def add(self, name: str, seconds: float) -> None:
        self.seconds[name] += seconds

    def shares(self) -> dict[str, float]:
        """`time/<phase>_s` and `time/<phase>_share` of the wall time since creation."""
        total = time.perf_counter() - self._start
        out = {"time/cycle_s": total}
        for name, secs in self.seconds.items():
            out[f"time/{name}_s"] = secs
            out[f"time/{name}_share"] = secs / total if total > 0 else 0.0
        other = total - sum(self.seconds.values())
        out["time/other_share"] = max(other, 0.0) / total if total > 0 else 0.0
        return out
