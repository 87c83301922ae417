"""Train with SPADE (or the fixed-environment baseline).

    python launch/train.py --config=configs/smollm2_135m.py --workdir=runs/smollm2
    python launch/train.py --config=configs/30b.py --workdir=gs://bucket/run1   # every TPU host

Several processes on one machine (CPU collectives over localhost; run both, ids 0 and 1):

    SPADE_COORDINATOR=localhost:12355 SPADE_NUM_PROCESSES=2 SPADE_PROCESS_ID=0 \
    SPADE_CPU_COLLECTIVES=gloo XLA_FLAGS=--xla_force_host_platform_device_count=4 \
    python launch/train.py --config=configs/tiny.py --workdir=runs/two_process

Any config key can be overridden: --config.total_cycles=10 --config.spade.plays_per_env=4.
A run resumes from the newest checkpoint in --workdir unless --noresume is given;
--time_budget_minutes=60 stops starting new cycles after an hour (the last one is saved).
Compiled programs are cached in <workdir>/compile_cache (--compile_cache_dir; empty: off).
"""

from __future__ import annotations

import logging

from absl import flags
from ml_collections import config_flags

from spade_jax.cli import run

_CONFIG = config_flags.DEFINE_config_file("config", None, "Path to a configs/*.py file.")
_WORKDIR = flags.DEFINE_string("workdir", "runs/default", "Checkpoints, metrics and env files.")
_RESUME = flags.DEFINE_bool("resume", True, "Continue from the newest checkpoint in --workdir.")
_UNSAFE = flags.DEFINE_bool(
    "allow_unsafe_sandbox", False,
    "Run designer code even if only rlimits (no bubblewrap/seccomp) are available.")
_BUDGET = flags.DEFINE_float(
    "time_budget_minutes", 0.0,
    "Start no new cycle after this many minutes (0: run all total_cycles); the last is saved.")
_COMPILE_CACHE = flags.DEFINE_string(
    "compile_cache_dir", None,
    "Persistent compilation cache, local or gs:// (default: <workdir>/compile_cache; "
    "empty: off). A resumed run loads its compiled programs from it.")
flags.mark_flags_as_required(["config"])


def main(argv):
    del argv
    from spade_jax import distributed
    from spade_jax.spade.driver import run_training
    from spade_jax.workdir import compile_cache_dir

    for noisy in ("absl", "orbax", "jax._src"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    distributed.initialize_from_environment()
    cfg = _CONFIG.value
    if _UNSAFE.value:
        cfg.sandbox.allow_unsafe = True
    budget = _BUDGET.value * 60 if _BUDGET.value > 0 else None
    run_training(cfg, _WORKDIR.value, resume=_RESUME.value, time_budget_s=budget,
                 compile_cache=compile_cache_dir(_WORKDIR.value, _COMPILE_CACHE.value))


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    run(main)
