"""Behaviour pin: a tiny fixed-seed run must write the metrics and environments in GOLDEN.

Refactors (e.g. issue 17's typed config records) must not change what a run does; this run
checks that end to end. When a change is meant to alter the run (new seed derivation, new
metrics), regenerate the golden and commit it with that change:

    python -m tests.loop.pin --write

Metrics are compared without the wall-clock keys (`time`, `time/*`, `throughput/*`), floats to a
relative 1e-5; environment files (code, validation reports, play statistics) exactly.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
from pathlib import Path

from tests import conftest  # noqa: F401  (8 CPU devices before JAX loads, as under pytest)

GOLDEN = Path(__file__).with_name("pin_golden.json")
CLOCK_KEYS = ("time",)  # the row's wall-clock timestamp
CLOCK_PREFIXES = ("time/", "throughput/")
REL_TOLERANCE = 1e-5


def pin_config():
    """The tiny config, two cycles (a regen cycle and a replay-only one), short generations."""
    from spade_jax.config import load_config_file

    cfg = load_config_file("tiny")
    cfg.seed = 0  # for now: any seed > 0 overflows the sampler's uint32 per-turn seed
    cfg.total_cycles = 2
    cfg.sampling.designer_max_new_tokens = 24
    cfg.sampling.agent_max_new_tokens = 8
    return cfg


def observe(workdir: Path) -> dict:
    """Metrics rows (less wall-clock keys) and every file under envs/, from a finished run."""
    rows = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
    metrics = [{k: v for k, v in row.items()
                if k not in CLOCK_KEYS and not k.startswith(CLOCK_PREFIXES)} for row in rows]
    envs = {path.relative_to(workdir).as_posix(): path.read_text(encoding="utf-8")
            for path in sorted((workdir / "envs").rglob("*")) if path.is_file()}
    return {"metrics": metrics, "envs": envs}


def run_pinned(workdir: Path) -> dict:
    """Train `pin_config()` in `workdir` with its own fresh Runtime; what it wrote."""
    from spade_jax.spade.driver import run_training

    run_training(pin_config(), str(workdir), resume=False)
    return observe(workdir)


def differences(observed: dict, golden: dict) -> list[str]:
    """Human-readable differences between two `observe` results (empty: they match)."""
    out = []
    if len(observed["metrics"]) != len(golden["metrics"]):
        out.append(f"{len(observed['metrics'])} metric rows, golden has "
                   f"{len(golden['metrics'])}")
    for got, want in zip(observed["metrics"], golden["metrics"], strict=False):
        cycle = want.get("cycle")
        for key in sorted(set(got) | set(want)):
            a, b = got.get(key), want.get(key)
            same = (math.isclose(a, b, rel_tol=REL_TOLERANCE, abs_tol=1e-9)
                    if isinstance(a, float) and isinstance(b, float) else a == b)
            if not same:
                out.append(f"cycle {cycle} {key}: {a!r}, golden {b!r}")
    for name in sorted(set(observed["envs"]) | set(golden["envs"])):
        got, want = observed["envs"].get(name), golden["envs"].get(name)
        if got != want:
            where = ("differs" if got is not None and want is not None
                     else "only in the golden" if got is None else "only in the run")
            out.append(f"envs file {name} {where}")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help=f"regenerate {GOLDEN.name}")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as workdir:
        observed = run_pinned(Path(workdir))
    if args.write:
        GOLDEN.write_text(json.dumps(observed, indent=1, sort_keys=True) + "\n")
        print(f"wrote {GOLDEN}")
        return
    found = differences(observed, json.loads(GOLDEN.read_text()))
    print("\n".join(found) or "the run matches the golden")
    sys.exit(1 if found else 0)


if __name__ == "__main__":
    main()
