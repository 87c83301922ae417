"""The LLM self-validation pass (`spade.self_validation`): the policy judges every environment
that passed the gate; a 'no' verdict makes the design invalid (retried, never admitted), a 'yes'
keeps it, and the cycle's metrics count the verdicts.

The Designer's and the judge's answers are scripted (tests/loop/pin.py's ScriptedSampler); the
gate, the prompts and the verdict parsing are the real ones.
"""

import dataclasses

import numpy as np
import pytest

from spade_jax.spade.designer import SELF_VALIDATION_CHECK
from spade_jax.spade.loop import HostState, run_designer, validation_metrics
from spade_jax.spade.memory import EnvMemory
from spade_jax.spade.self_validation import GAME_SELF_VALIDATION_PROMPT, Verdict
from tests.loop.pin import ScriptedSampler, short_seed_codes

JUDGE_MARKER = GAME_SELF_VALIDATION_PROMPT.splitlines()[0]  # first line of the judge's prompt
REJECTED_CLASS = "class EquationChainEnv"  # the judge says no to this design, yes to the other


class JudgingSampler(ScriptedSampler):
    """ScriptedSampler whose judge prompts get '\\boxed{no}' for REJECTED_CLASS, else a yes."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.judged = 0

    def answer(self, prompt: str, row: int, seed: int) -> str:
        if JUDGE_MARKER in prompt:
            self.judged += 1
            verdict = "no" if REJECTED_CLASS in prompt else "yes"
            return f"The win branch is reachable: \\boxed{{{verdict}}}"
        return super().answer(prompt, row, seed)


def design(rt, *, self_validation: bool, max_attempts: int = 1):
    """One regeneration's `run_designer` with the two short seed games as the Designer's answers
    (slot 0 gets EquationChain, slot 1 SequenceExtend, retries again in that order)."""
    codes = short_seed_codes(rt.seed_envs)
    assert REJECTED_CLASS in codes[0] and REJECTED_CLASS not in codes[1]
    sampler, rt.sampler = rt.sampler, JudgingSampler(rt.tokenizer, codes)
    s = dataclasses.replace(rt.run.spade, games_per_cycle=2, max_attempts=max_attempts,
                            self_validation=self_validation)
    sampling = dataclasses.replace(rt.run.sampling, designer_max_new_tokens=4096)  # a seed's code
    try:
        attempts, admitted = run_designer(rt, s, sampling, HostState(0, EnvMemory(), []), None,
                                          np.random.default_rng(0), slots=s.games_per_cycle)
        return attempts, admitted, rt.sampler.judged
    finally:
        rt.sampler = sampler


def test_a_reject_verdict_removes_the_design_and_an_accept_keeps_it(tiny_runtime):
    attempts, admitted, judged = design(tiny_runtime, self_validation=True)
    assert judged == 2  # both designs passed the gate, both were judged
    rejected, accepted = attempts
    assert (rejected.verdict, accepted.verdict) == (Verdict.REJECT, Verdict.ACCEPT)
    assert not rejected.valid and rejected.report.failures[0][0] == SELF_VALIDATION_CHECK
    assert "win branch is reachable" in rejected.report.failures[0][1]
    [kept] = admitted
    assert accepted.valid and kept.attempt is accepted and "class SequenceExtendEnv" in kept.code
    metrics = validation_metrics(attempts, self_validation=True)
    assert metrics["self_validation/accept"] == 1 and metrics["self_validation/reject"] == 1
    assert metrics["self_validation/no_verdict"] == 0
    assert metrics[f"designer/fail_{SELF_VALIDATION_CHECK}"] == 1
    assert metrics["designer/valid_rate"] == pytest.approx(0.5)


def test_a_rejected_design_is_retried_like_an_invalid_one(tiny_runtime):
    attempts, admitted, judged = design(tiny_runtime, self_validation=True, max_attempts=2)
    assert [(a.slot, a.attempt, a.valid) for a in attempts] == [
        (0, 0, False), (1, 0, True), (0, 1, False)]  # slot 0's retry is EquationChain again
    assert judged == 3 and len(admitted) == 1


def test_without_self_validation_nothing_is_judged_and_no_verdict_is_counted(tiny_runtime):
    attempts, admitted, judged = design(tiny_runtime, self_validation=False)
    assert judged == 0 and len(admitted) == 2
    assert all(a.verdict is None for a in attempts)
    assert not any(k.startswith("self_validation/") for k in validation_metrics(attempts))
