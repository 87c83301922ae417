"""The Designer phase: prompt, generate, validate, retry with a fresh document.

Every slot of a regeneration cycle asks the policy for one environment. Invalid attempts are
retried (up to `max_attempts`, each with a freshly sampled grounding document); every attempt is
kept, so the loop can train on invalid generations with a penalty (`penalize_invalid`) instead
of hiding them as the reference does. With a `judge` (spade.self_validation) the policy then
audits each environment that passed the gate; one it rejects is invalid, by the check
`self_validation`, and retried like any other. Generation, validation and judging are passed in
as functions, which keeps this module free of device code and testable with scripted designers.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

from spade_jax.spade.self_validation import Verdict

Messages = list[dict[str, str]]


@dataclasses.dataclass
class DesignAttempt:
    """One generation of one slot: what was asked, what came back, what validation said."""

    slot: int
    attempt: int
    skill: str
    doc_id: str | None
    messages: Messages
    completion: Any  # sampler Completion: .text, .tokens, .logprobs
    report: Any  # envs.ValidationReport: .ok, .failures, .code (None when V0 failed)
    verdict: Verdict | None = None  # the self-validation pass's, if it judged this attempt

    @property
    def valid(self) -> bool:
        return bool(self.report.ok)


@dataclasses.dataclass
class DesignedEnv:
    """An admitted environment: validated code plus where it came from."""

    env_id: str
    skill: str
    code: str
    doc_id: str | None
    cycle: int
    attempt: DesignAttempt | None = None  # None for environments replayed from memory
    hint: str = ""
    # designed between regenerations to refill a short pool (`spade.top_up`): played until
    # the next regeneration, never trained as a Designer sample nor stored in memory
    top_up: bool = False


def env_id_for(cycle: int, slot: int, skill: str) -> str:
    """Stable, readable environment id: cycle, slot and skill."""
    return f"c{cycle:05d}_s{slot:03d}_{skill.lower()}"


SELF_VALIDATION_CHECK = "self_validation"  # the failure a rejecting verdict records


def judged(report, verdict: Verdict, reasoning: str):
    """`report` (a gate-passing ValidationReport) after the self-validation verdict: unchanged
    unless the verdict rejects it, then failed by SELF_VALIDATION_CHECK with the reasoning's
    start, so that the loop, the metrics and the artifacts treat it as any invalid design."""
    if verdict.keeps:
        return report
    excerpt = " ".join(reasoning.split())[:200]
    return dataclasses.replace(report, ok=False, failures=[
        (SELF_VALIDATION_CHECK, f"the policy's self-validation verdict was no: {excerpt}")])


def design_environments(
    skills: Sequence[str],
    *,
    cycle: int,
    build_prompt: Callable[[int, str, int], tuple[Messages, str | None]],
    generate: Callable[[list[Messages]], list[Any]],
    validate_many: Callable[[list[str]], list[Any]],
    max_attempts: int,
    judge: Callable[[list[str]], list[tuple[Verdict, str]]] | None = None,
) -> tuple[list[DesignAttempt], list[DesignedEnv]]:
    """Fill one slot per entry of `skills`, retrying invalid designs.

    `build_prompt(slot, skill, attempt)` returns the chat messages and the grounding document id;
    `generate(messages_list)` returns one completion per prompt (batched on device);
    `validate_many(texts)` returns one validation report (`.ok`, `.code`) per text (divided
    among the hosts by the runtime); `judge(codes)`, if given, returns a (verdict, reasoning)
    per environment code that passed the gate (batched on device). Returns every attempt and
    the admitted environments (at most one per slot).
    """
    attempts: list[DesignAttempt] = []
    admitted: list[DesignedEnv] = []
    pending = list(range(len(skills)))
    for attempt_no in range(max_attempts):
        if not pending:
            break
        prompts = [build_prompt(slot, skills[slot], attempt_no) for slot in pending]
        completions = generate([messages for messages, _ in prompts])
        reports = list(validate_many([c.text for c in completions]))
        verdicts: list[Verdict | None] = [None] * len(reports)
        passed = [i for i, r in enumerate(reports) if r.ok]
        if judge is not None and passed:
            for i, (verdict, reasoning) in zip(
                    passed, judge([reports[i].code for i in passed]), strict=True):
                verdicts[i], reports[i] = verdict, judged(reports[i], verdict, reasoning)
        still_pending = []
        for slot, (messages, doc_id), completion, report, verdict in zip(
            pending, prompts, completions, reports, verdicts, strict=True
        ):
            record = DesignAttempt(slot, attempt_no, skills[slot], doc_id, messages,
                                   completion, report, verdict)
            attempts.append(record)
            if record.valid:
                admitted.append(DesignedEnv(
                    env_id=env_id_for(cycle, slot, skills[slot]), skill=skills[slot],
                    code=report.code, doc_id=doc_id, cycle=cycle, attempt=record,
                ))
            else:
                still_pending.append(slot)
        pending = still_pending
    return attempts, admitted
