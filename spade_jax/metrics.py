"""Run metrics: `metrics.jsonl` and TensorBoard events in the workdir, phase timers, progress.

Only process 0 writes host files in a multi-host run; the others get a writer that drops
everything, so callers never need to check the process index.
"""

from __future__ import annotations

import contextlib
import json
import math
import time
from collections import defaultdict

import numpy as np
from etils import epath

from spade_jax.workdir import is_remote, open_append, register_tensorboard_bucket_writer


class MetricsWriter:
    """Append scalar metrics per cycle to `metrics.jsonl` and TensorBoard event files."""

    def __init__(self, workdir: str, *, enabled: bool = True):
        self.enabled = enabled
        self._jsonl = None
        self._tb = None
        if not enabled:
            return
        directory = epath.Path(workdir)
        directory.mkdir(parents=True, exist_ok=True)
        self._jsonl = open_append(directory / "metrics.jsonl")
        from tensorboardX import SummaryWriter

        if is_remote(workdir):
            register_tensorboard_bucket_writer()
        self._tb = SummaryWriter(str(directory / "tensorboard"))

    def write(self, step: int, metrics: dict[str, float]) -> None:
        """Record `metrics` for `step`; non-finite values are kept in JSON as null."""
        if not self.enabled:
            return
        clean = {k: _to_float(v) for k, v in metrics.items()}
        record = {"cycle": step, "time": time.time(), **clean}
        self._jsonl.write(json.dumps(record, sort_keys=True) + "\n")
        self._jsonl.flush()
        for key, value in clean.items():
            if value is not None:
                self._tb.add_scalar(key, value, step)
        self._tb.flush()

    def close(self) -> None:
        if self._jsonl:
            self._jsonl.close()
        if self._tb:
            self._tb.close()


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
