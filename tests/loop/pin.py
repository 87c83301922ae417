"""Behaviour pin: a tiny fixed-seed run must write the metrics and environments in GOLDEN.

Refactors (e.g. issue 17's typed config records) must not change what a run does; this run
checks that end to end. When a change is meant to alter the run (new seed derivation, new
metrics), regenerate the golden and commit it with that change:

    python -m tests.loop.pin --write

The model's answers are scripted (`ScriptedSampler`): what a random model samples depends on how
a CPU rounds its logits, and the pin must hold on every CPU. The Designer answers with seed
environments, so designs pass the gate and are played, rewarded, trained and remembered; the
Agent's answers are a function of (seed, row, turn). Everything else is the real loop, the real
sandbox and the real train step. Metrics are compared without the wall-clock keys (`time`,
`time/*`, `throughput/*`), floats to a relative 1e-4 (the train step's float sums differ between
CPUs in the last bits); environment files (code, validation reports, play statistics) exactly.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
from pathlib import Path

import numpy as np

from tests import conftest  # noqa: F401  (8 CPU devices before JAX loads, as under pytest)

GOLDEN = Path(__file__).with_name("pin_golden.json")
CLOCK_KEYS = ("time",)  # the row's wall-clock timestamp
CLOCK_PREFIXES = ("time/", "throughput/")
REL_TOLERANCE = 1e-4
ABS_TOLERANCE = 1e-6
SHORT_SEED_ENVS = ("equation_chain", "sequence_extend")
DESIGNER_MARKER = "game designer"  # in the Designer's system prompt, in no Agent prompt
AGENT_ANSWERS = ("\\boxed{1}", "\\boxed{north}", "\\boxed{A}", "I do not know.")


def pin_config():
    """The tiny config, two cycles (a regen cycle and a replay-only one), seed 3."""
    from spade_jax.config import load_config_file

    cfg = load_config_file("tiny")
    cfg.seed = 3
    cfg.total_cycles = 2
    cfg.sampling.designer_max_new_tokens = 4096  # room for a seed environment's code
    return cfg


class ScriptedSession:
    """A sampler session (the `Session` interface `Runtime`, `Engine` and `play_episodes` use)
    whose answers come from `answer(prompt_text, row, seed)` instead of the model. `row` is
    the row's key id (the engine's request index); a row's later turns pass `seed` plus the
    number of turns it already had, so a scripted Agent may answer each turn anew. A turn
    completes in one `decode_segment`."""

    def __init__(self, tokenizer, answer, prompts, capacity: int):
        self.tokenizer, self.answer, self.capacity = tokenizer, answer, capacity
        self.num_rows = len(prompts)
        self.key_ids = np.arange(self.num_rows, dtype=np.int32)
        self.prompt_texts = [""] * self.num_rows
        self.decode_steps = 0  # a scripted turn runs no decode loop
        self.sequences, self.loss_masks, self.logprobs, self.sampling_logprobs, \
            self.turns_done = ([None] * self.num_rows for _ in range(5))
        self.restart(dict(enumerate(prompts)))

    def restart(self, prompts) -> None:
        for r, p in prompts.items():
            self.prompt_texts[r] = self.tokenizer.decode(p)
            self.sequences[r] = list(map(int, p))
            self.loss_masks[r] = [0] * len(p)
            self.logprobs[r] = [0.0] * len(p)
            self.sampling_logprobs[r] = [0.0] * len(p)
            self.turns_done[r] = 0

    @property
    def free_slots(self) -> np.ndarray:
        return np.array([self.capacity - len(s) for s in self.sequences])

    def append(self, observations) -> None:
        for r, obs in enumerate(observations):
            obs = list(map(int, obs or ()))
            self.sequences[r] += obs
            self.loss_masks[r] += [0] * len(obs)
            self.logprobs[r] += [0.0] * len(obs)
            self.sampling_logprobs[r] += [0.0] * len(obs)

    def decode(self, max_new_tokens, *, active=None, **settings):
        limits = np.broadcast_to(np.asarray(max_new_tokens), (self.num_rows,)).copy()
        if active is not None:
            limits[~np.asarray(active, bool)] = 0
        turn = self.begin_turn(limits, **settings)
        self.decode_segment(turn)
        return turn.outputs

    def begin_turn(self, limits, *, stop_token_ids=(), seed=0, **_):
        from spade_jax.sampling.session import Turn

        turn = Turn([None] * self.num_rows, np.zeros((self.num_rows,), np.int32),
                    np.zeros((self.num_rows,), bool), (list(stop_token_ids), seed))
        self.start_rows(turn, {r: int(n) for r, n in enumerate(limits) if n > 0})
        return turn

    def start_rows(self, turn, limits) -> None:
        from spade_jax.sampling.session import FinishReason, TurnOutput

        for r, limit in limits.items():
            turn.outputs[r] = TurnOutput([], [], [], FinishReason.LENGTH)
            turn.remaining[r], turn.running[r] = limit, True

    def decode_segment(self, turn, exit_after_finished=None, max_steps=None) -> None:
        from spade_jax.sampling.session import FinishReason

        stop_token_ids, seed = turn.settings
        for r in np.flatnonzero(turn.running):
            text = self.answer(self.prompt_texts[r], int(self.key_ids[r]),
                               seed + self.turns_done[r])
            tokens = self.tokenizer.encode(text, add_special_tokens=False)
            tokens = (tokens + list(stop_token_ids[:1]))[:turn.remaining[r]]
            stopped = bool(stop_token_ids) and tokens[-1:] == list(stop_token_ids[:1])
            logps = [-1.0] * len(tokens)
            out = turn.outputs[r]
            out.tokens, out.logprobs, out.sampling_logprobs = tokens, logps, logps
            out.finish_reason = FinishReason.STOP if stopped else FinishReason.LENGTH
            self.sequences[r] += tokens
            self.loss_masks[r] += [1] * len(tokens)
            self.logprobs[r] += logps
            self.sampling_logprobs[r] += logps
            self.turns_done[r] += 1
            turn.running[r] = False


class ScriptedSampler:
    """Stands in for `Runtime.sampler`: a prompt holding `designer_marker` gets the next of
    `designs` (each made new to the memory by a constant), any other prompt (the Agent's) an
    answer of `agent_answers` chosen by (seed, row)."""

    def __init__(self, tokenizer, designs, *, designer_marker=DESIGNER_MARKER,
                 agent_answers=AGENT_ANSWERS):
        self.tokenizer = tokenizer
        self.codes, self.marker, self.answers = list(designs), designer_marker, agent_answers
        self.designs = 0

    def answer(self, prompt: str, row: int, seed: int) -> str:
        if self.marker in prompt:
            code = self.codes[self.designs % len(self.codes)]
            self.designs += 1
            return f"```python\n{code}\nDESIGN_ID = {self.designs}\n```"
        return self.answers[(seed + row) % len(self.answers)]

    def start(self, prompts, *, capacity: int) -> ScriptedSession:
        return ScriptedSession(self.tokenizer, self.answer, prompts, capacity)

    def set_params(self, params) -> None:
        """The answers are scripted: new weights change nothing."""


def short_seed_codes(seed_envs) -> list[str]:
    """The seed games solvable within the tiny config's 3 turns, in name order."""
    return [e.code for e in sorted(seed_envs, key=lambda e: e.name)
            if e.name.endswith(SHORT_SEED_ENVS)]


def observe(workdir: Path) -> dict:
    """Metrics rows (less wall-clock keys) and every file under envs/, from a finished run."""
    rows = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
    metrics = [{k: v for k, v in row.items()
                if k not in CLOCK_KEYS and not k.startswith(CLOCK_PREFIXES)} for row in rows]
    envs = {path.relative_to(workdir).as_posix(): path.read_text(encoding="utf-8")
            for path in sorted((workdir / "envs").rglob("*")) if path.is_file()}
    return {"metrics": metrics, "envs": envs}


def run_pinned(workdir: Path) -> dict:
    """Train `pin_config()` in `workdir` with a fresh Runtime whose sampler is scripted."""
    import jax

    from spade_jax.config import parse
    from spade_jax.spade.driver import run_training
    from spade_jax.spade.runtime import Runtime

    cfg = pin_config()
    rt = Runtime.create(parse(cfg, jax.device_count()))
    try:
        rt.sampler = ScriptedSampler(rt.tokenizer, short_seed_codes(rt.seed_envs))
        run_training(cfg, str(workdir), resume=False, runtime=rt)
    finally:
        rt.close()
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
            same = (math.isclose(a, b, rel_tol=REL_TOLERANCE, abs_tol=ABS_TOLERANCE)
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
