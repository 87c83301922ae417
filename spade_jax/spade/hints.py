"""Privileged hints: obtain, clean, leak-check and inject them (docs/DESIGN.md §4.5).

Modes:

* ``self`` (reference default): the policy reads the environment code (`hint_messages`,
  re-exported from ``prompts``) and writes a hint; the loop makes that untrained call
  (temperature 0.3) and passes the text to `resolve_hint`.
* ``designer``: the environment's own ``hint()`` text.

A hint that contains the normalised solution is rejected (``spade_jax.envs.contract
.hint_leaks``), and so is an empty one. A hint play that was shown no hint does not count
for regret; with none shown (or no hint written, which means no hint plays) the hint side's
mean is 0, as the reference's regret when hint generation fails (`loop.EnvPlays`).
The accepted hint is appended to the first observation only:
``"{first_observation}\\n\\nHINT: {hint}"``.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import re

from spade_jax.envs.contract import hint_leaks
from spade_jax.spade.prompts import hint_messages

__all__ = [
    "HINT_TEMPLATE", "HintMode", "HintResult", "HintSchedule", "HintStatus", "clean_hint",
    "hint_leaks", "hint_messages", "inject_hint", "resolve_hint",
]



class HintMode(enum.StrEnum):
    """Who writes a hint: the policy reading the code (SELF) or the environment's hint()."""

    SELF = "self"
    DESIGNER = "designer"


class HintSchedule(enum.StrEnum):
    """Which plays get hint plays. REGEN (reference orchestrator: the hint phase runs at
    regeneration steps only): the environments designed this cycle, nothing else; EVERY_CYCLE:
    every environment played, every cycle, memory replays included."""

    REGEN = "regen"
    EVERY_CYCLE = "every_cycle"

    def hinted(self, played_ids: list[str], designed_ids: set[str]) -> set[str]:
        """The ids among ``played_ids`` that get hint plays this cycle."""
        if self is HintSchedule.EVERY_CYCLE:
            return set(played_ids)
        return {i for i in played_ids if i in designed_ids}


class HintStatus(enum.StrEnum):
    """Why a hint asked for was shown (OK) or dropped (EMPTY after cleaning, or a LEAK of the
    solution); NONE when no hint was asked."""

    NONE = ""
    OK = "ok"
    EMPTY = "empty"
    LEAK = "leak"


HINT_TEMPLATE = "{first_observation}\n\nHINT: {hint}"
MAX_HINT_WORDS = 100
HINT_ATTEMPTS = 3  # reference SelfHintGenerator.generate_hint_with_retry: an empty reply retried

_THINK = re.compile(r"<think>.*?(</think>|\Z)", re.DOTALL | re.IGNORECASE)
_FENCE = re.compile(r"^```[\w-]*\s*\n?(.*?)\n?```$", re.DOTALL)
_LABEL = re.compile(r"^(\*\*)?\s*hint\s*(\*\*)?\s*[:\-]\s*(\*\*)?\s*", re.IGNORECASE)


def inject_hint(first_observation: str, hint: str) -> str:
    """The first observation with the hint appended (first turn only)."""
    return HINT_TEMPLATE.format(first_observation=first_observation, hint=hint)


def clean_hint(text: str | None, max_words: int = MAX_HINT_WORDS) -> str | None:
    """Hint text from raw model (or ``hint()``) output; None when nothing usable remains.

    Drops ``<think>`` blocks, unwraps a code fence and a ``{"hint": ...}`` JSON object,
    removes a leading "Hint:" label and surrounding quotes, joins lines, and caps the hint at
    ``max_words`` words.
    """
    if not isinstance(text, str):
        return None
    text = _THINK.sub("", text).strip()
    fenced = _FENCE.match(text)
    if fenced:
        text = fenced.group(1).strip()
    if text.startswith("{"):
        try:
            data = json.loads(text)
        except json.JSONDecodeError:
            data = None
        if isinstance(data, dict) and isinstance(data.get("hint"), str):
            text = data["hint"]
    text = _LABEL.sub("", text.strip())
    text = " ".join(text.split()).strip("\"'` ")
    words = text.split()
    if len(words) > max_words:
        text = " ".join(words[:max_words])
    return text or None


@dataclasses.dataclass(frozen=True)
class HintResult:
    """The accepted hint, or None with the reason (``empty`` or ``leak``)."""

    hint: str | None
    reason: HintStatus = HintStatus.OK


def resolve_hint(mode: HintMode, text: str | None, solution: str | None) -> HintResult:
    """Clean and check a hint of ``mode`` against the environment's ``solution()``.

    ``text`` is the policy's reply in mode ``self`` and the env's ``hint()`` in mode
    ``designer``. ``solution`` None (unknown) skips the leak check.
    """
    if mode not in tuple(HintMode):
        raise ValueError(f"hint mode {mode!r} is not one of {tuple(HintMode)}")
    hint = clean_hint(text)
    if hint is None:
        return HintResult(None, HintStatus.EMPTY)
    if solution is not None and hint_leaks(hint, solution):
        return HintResult(None, HintStatus.LEAK)
    return HintResult(hint)
