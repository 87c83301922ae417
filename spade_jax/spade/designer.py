"""The Designer phase: prompt, generate, validate, retry with a fresh document.

Every slot of a regeneration cycle asks the policy for one environment. Invalid attempts are
retried (up to `max_attempts`, each with a freshly sampled grounding document); every attempt is
kept, so the loop can train on invalid generations with a penalty (`penalize_invalid`) instead
of hiding them as the reference does. Generation and validation are passed in as functions,
which keeps this module free of device code and testable with scripted designers.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Callable, Sequence
from typing import Any

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


def env_id_for(cycle: int, slot: int, skill: str) -> str:
    """Stable, readable environment id: cycle, slot and skill."""
    return f"c{cycle:05d}_s{slot:03d}_{skill.lower()}"


def code_digest(code: str) -> str:
    """Short content hash used to name files of replayed environments."""
    return hashlib.sha256(code.encode()).hexdigest()[:12]


def design_environments(
    skills: Sequence[str],
    *,
    cycle: int,
    build_prompt: Callable[[int, str, int], tuple[Messages, str | None]],
    generate: Callable[[list[Messages]], list[Any]],
    validate_many: Callable[[list[str]], list[Any]],
    max_attempts: int,
) -> tuple[list[DesignAttempt], list[DesignedEnv]]:
    """Fill one slot per entry of `skills`, retrying invalid designs.

    `build_prompt(slot, skill, attempt)` returns the chat messages and the grounding document id;
    `generate(messages_list)` returns one completion per prompt (batched on device);
    `validate_many(texts)` returns one validation report (`.ok`, `.code`) per text (divided
    among the hosts by the runtime). Returns every attempt and the admitted environments (at
    most one per slot).
    """
    attempts: list[DesignAttempt] = []
    admitted: list[DesignedEnv] = []
    pending = list(range(len(skills)))
    for attempt_no in range(max_attempts):
        if not pending:
            break
        prompts = [build_prompt(slot, skills[slot], attempt_no) for slot in pending]
        completions = generate([messages for messages, _ in prompts])
        reports = validate_many([c.text for c in completions])
        still_pending = []
        for slot, (messages, doc_id), completion, report in zip(
            pending, prompts, completions, reports, strict=True
        ):
            record = DesignAttempt(slot, attempt_no, skills[slot], doc_id, messages,
                                   completion, report)
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
