"""One SPADE cycle on SmolLM2-135M-Instruct: where the wall time goes.

    python bench/loop.py [--config=configs/smollm2_135m.py] [--cycles=1]

Runs real cycles (Designer generation, validation, hints, K+K plays, one train step) in a
temporary workdir and prints the share of wall time per phase. "Host overhead" is everything
that is not device work: environment execution in the sandbox plus host bookkeeping (prompting,
rewards, memory, files, checkpoints). Target: ≤ 10 % of the cycle.
"""

from __future__ import annotations

import argparse
import logging
import tempfile


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="configs/smollm2_135m.py")
    parser.add_argument("--cycles", type=int, default=1)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    from spade_jax.config import load_config_file

    cfg = load_config_file(args.config)
    cfg.total_cycles = args.cycles

    from spade_jax.spade.driver import run_training

    with tempfile.TemporaryDirectory() as workdir:
        history = run_training(cfg, workdir, resume=False)
    for row in history:
        total = row["time/cycle_s"]
        device = row.get("time/sampling_s", 0.0) + row.get("time/training_s", 0.0)
        host = total - device
        print(f"\ncycle {row['cycle']}: {total:.1f} s")
        for phase in ("sampling", "training", "env"):
            secs = row.get(f"time/{phase}_s", 0.0)
            print(f"  {phase:<10} {secs:8.1f} s  {100 * secs / total:5.1f} %")
        other = total - device - row.get("time/env_s", 0.0)
        print(f"  {'other':<10} {other:8.1f} s  {100 * other / total:5.1f} %  (host bookkeeping)")
        print(f"  host overhead (env + bookkeeping): {100 * host / total:.1f} % (target <= 10 %)")
        print(f"  generated tokens/s while sampling: {row['throughput/tokens_per_s']:.1f}")


if __name__ == "__main__":
    main()
