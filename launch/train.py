"""Train with SPADE (or the fixed-environment baseline).

    python launch/train.py --config=configs/smollm2_135m.py --workdir=runs/smollm2
    python launch/train.py --config=configs/30b.py --workdir=gs://bucket/run1   # every TPU host

Any config key can be overridden: --config.total_cycles=10 --config.spade.plays_per_env=4.
A run resumes from the newest checkpoint in --workdir unless --noresume is given.
"""

from __future__ import annotations

import logging

from absl import app, flags
from ml_collections import config_flags

_CONFIG = config_flags.DEFINE_config_file("config", None, "Path to a configs/*.py file.")
_WORKDIR = flags.DEFINE_string("workdir", "runs/default", "Checkpoints, metrics and env files.")
_RESUME = flags.DEFINE_bool("resume", True, "Continue from the newest checkpoint in --workdir.")
_UNSAFE = flags.DEFINE_bool(
    "allow_unsafe_sandbox", False,
    "Run designer code even if only rlimits (no bubblewrap/seccomp) are available.")
flags.mark_flags_as_required(["config"])


def main(argv):
    del argv
    from spade_jax import distributed
    from spade_jax.spade.driver import run_training

    for noisy in ("absl", "orbax", "jax._src"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    distributed.initialize_from_environment()
    cfg = _CONFIG.value
    if _UNSAFE.value:
        cfg.sandbox.allow_unsafe = True
    run_training(cfg, _WORKDIR.value, resume=_RESUME.value)


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    app.run(main)
