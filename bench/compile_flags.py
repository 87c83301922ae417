"""The test suite's XLA-CPU flags: what the tests' compilations cost under each set.

    python bench/compile_flags.py [--rounds 2] [--test-file tests/rl/test_trainer.py]

Most of the suite's time is XLA compiling small programs (`tests/commands.py`). For each flag
set, in a fresh process (XLA reads its flags once): the tiny config's train step and sampler
programs compiled on one CPU device and on a mesh of 8 fake ones (`readiness.check`, its
compile seconds, XLA's memory and cost analyses), and a whole test file's wall time without
a compilation cache. Rounds interleave the sets, each round starting with the other. XLA's
analyses must agree within 1 % across the sets: the flags change how XLA emits the programs'
code, not what they compute (the HLO may differ by a fusion's temporaries).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

from sampler import cpu_model  # bench/: this script's folder is on sys.path

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from tests.commands import TEST_XLA_FLAGS  # noqa: E402  (the suite's flags, measured as they are)

FLAG_SETS = {
    "before": "--xla_backend_optimization_level=0",
    "after": TEST_XLA_FLAGS,
}


def compile_programs() -> None:
    """Child: compile the tiny config's programs on 1 and 8 devices; one JSON line."""
    from spade_jax import readiness
    from spade_jax.config import load_config_file, parse

    run = parse(load_config_file("tiny"))
    rows = {}
    for devices in (1, 8):
        reports, _ = readiness.check(run, devices, layers=None, seq_len=None)
        for r in reports:
            rows[f"{r.name}@{devices}"] = dict(seconds=r.compile_s, memory=r.memory,
                                                flops=r.flops)
    print(json.dumps(rows))


def run_child(flags: str) -> dict:
    env = {**os.environ, "XLA_FLAGS": f"{flags} --xla_force_host_platform_device_count=8",
           "JAX_PLATFORMS": "cpu", "PYTHONPATH": ROOT}
    out = subprocess.run([sys.executable, __file__, "--child"], env=env, check=True,
                         capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def run_test_file(flags: str, test_file: str) -> float:
    """Wall seconds of one pytest process over `test_file`, no compilation cache."""
    env = {**os.environ, "XLA_FLAGS": flags, "SPADE_TEST_COMPILE_CACHE": "0"}
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "pytest", "-q", "-n", "0", "-p", "no:cacheprovider",
                    test_file], env=env, cwd=ROOT, check=True, capture_output=True)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--test-file", default="tests/rl/test_trainer.py")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return compile_programs()

    print(f"CPU: {cpu_model()}, {os.cpu_count()} cores visible; load average "
          f"{os.getloadavg()[0]:.2f}", flush=True)
    names = list(FLAG_SETS)
    for name, flags in FLAG_SETS.items():
        print(f"{name}: XLA_FLAGS={flags}")
    programs = {name: [] for name in names}
    files = {name: [] for name in names}
    for round_ in range(args.rounds):
        for name in names if round_ % 2 == 0 else names[::-1]:
            programs[name].append(run_child(FLAG_SETS[name]))
            files[name].append(run_test_file(FLAG_SETS[name], args.test_file))
            seconds = sum(p["seconds"] for p in programs[name][-1].values())
            print(f"round {round_}: {name}: programs compiled in {seconds:.1f}s, "
                  f"{args.test_file} in {files[name][-1]:.1f}s", flush=True)

    base, new = names
    spread = {"temp": 0.0, "flops": 0.0}
    print(f"\n{'median seconds':<30}{base:>10}{new:>10}  ratio")
    for key in programs[base][0]:
        a = statistics.median(p[key]["seconds"] for p in programs[base])
        b = statistics.median(p[key]["seconds"] for p in programs[new])
        print(f"compile {key:<22}{a:10.2f}{b:10.2f}  {a / b:.2f}x")
        # the generated code's size is the emitters' own; buffers and FLOPs are the HLO's
        for field, value in (("temp", lambda p: p["memory"]["temp"]),
                             ("flops", lambda p: p["flops"])):
            values = [value(p[key]) for name in names for p in programs[name]]
            spread[field] = max(spread[field], (max(values) - min(values)) / max(values))
    a, b = (statistics.median(files[n]) for n in names)
    print(f"{args.test_file:<30}{a:10.1f}{b:10.1f}  {a / b:.2f}x")
    print(f"XLA's analyses across the sets, largest relative difference of a program: "
          f"temporaries {spread['temp']:.1e}, FLOPs {spread['flops']:.1e}")
    assert max(spread.values()) < 0.01, "the flags changed the programs, not just their code"


if __name__ == "__main__":
    main()
