"""The self-validation pass (``spade.self_validation``): the policy audits a new environment
that passed the gate and answers ``\\boxed{yes}`` to keep it or ``\\boxed{no}`` to reject it.

The reference's `EnvironmentValidator` with the training model (`--spade-use-env-validator`):
games get a lenient "is it playable and winnable" check; tool-use environments a solvability
audit that rejects impossible tasks and keeps hard ones.
"""

from __future__ import annotations

import enum
import re

from spade_jax.spade.prompts import GameType

GAME_SELF_VALIDATION_SYSTEM_PROMPT = (
    "You check Python text games that were generated automatically. Reject a game only for a "
    "clear bug that makes it unplayable or unwinnable; when unsure, keep it."
)

GAME_SELF_VALIDATION_PROMPT = """\
Can this game be played and won? Keep it unless it has a clear, fatal bug.

```python
{code}
```

Check two things:
1. Solvable: a player who understands the rules can work out a winning answer. A fatal bug is \
e.g. an answer that depends on randomness the player never sees, or rules that contradict the \
code that checks the answer.
2. Winnable: the winning action really ends the game with a positive reward. A fatal bug is \
e.g. a comparison between mismatched types that can never succeed, or a win branch that no \
action reaches.

Rough error messages, odd formatting and rare edge cases are not fatal.

End with \\boxed{{yes}} to keep the game, or \\boxed{{no}} if it has a fatal bug."""

TOOL_USE_SELF_VALIDATION_SYSTEM_PROMPT = (
    "You audit Python tool-use environments that were generated automatically, for one "
    "property: can the task be completed at all? Reject an environment when no sequence of "
    "tool calls can meet its success criteria; keep it when such a sequence exists, however "
    "hard it is to find. A hard task is useful training; an impossible one is not."
)

TOOL_USE_SELF_VALIDATION_PROMPT = """\
Decide whether the task of this tool-use environment can be completed. The agent calls the \
tools over several turns, then answers with <answer>...</answer> or simply satisfies every \
user request. The task is completable when SOME sequence of tool calls makes every success \
condition true (the _message_criteria, the answer check, the reward and termination logic).

```python
{code}
```

Work through it:
1. List each success condition and the exact state or answer it needs.
2. For each, find the tool (or the answer) that produces it: a tool that assigns that value, \
or a tool result that reveals it. A value chosen at random is fine when some tool returns it \
to the agent and stays the same when asked again.
3. Reject when any condition:
   - needs a state value that no tool ever assigns, or contradicts another condition;
   - can never hold because of types (a string looked up in a list of dicts, 5 against "5");
   - is set only by a tool that always fails (e.g. it looks up a key that nothing stores);
   - needs an exact hidden value (id, date, amount) that neither the task text nor any tool \
result gives, so the agent could only guess it;
   or when most of the conditions already hold on the state reset() builds, so the task is \
won without doing it (one such step in an otherwise sound task is fine).
4. Do not reject for difficulty: values found only through lookups, long ordered sequences, \
unneeded tools and careful reading are all fine. Ignore cosmetic problems.

End with \\boxed{{yes}} when the task can be completed, or \\boxed{{no}} when it cannot."""


# (system prompt, user prompt with a ``{code}`` field) by game type.
PROMPTS = {
    GameType.GAME: (GAME_SELF_VALIDATION_SYSTEM_PROMPT, GAME_SELF_VALIDATION_PROMPT),
    GameType.TOOL_USE: (TOOL_USE_SELF_VALIDATION_SYSTEM_PROMPT, TOOL_USE_SELF_VALIDATION_PROMPT),
}


class Verdict(enum.StrEnum):
    """What the self-validation pass said of one environment."""

    ACCEPT = "accept"
    REJECT = "reject"
    NO_VERDICT = "no_verdict"  # no \\boxed{} answer: kept, as the reference keeps it

    @property
    def keeps(self) -> bool:
        return self is not Verdict.REJECT


_BOXED_RE = re.compile(r"\\boxed\{([^{}]*)\}")
ACCEPT_WORDS = ("yes", "y", "true")


def self_validation_messages(code: str, game_type: GameType = GameType.GAME
                             ) -> list[dict[str, str]]:
    """Messages asking the policy whether the environment ``code`` is playable and winnable
    (games) or completable (tool use)."""
    system, prompt = PROMPTS[game_type]
    return [{"role": "system", "content": system},
            {"role": "user", "content": prompt.format(code=code)}]


def parse_verdict(text: str) -> Verdict:
    """The verdict in the last ``\\boxed{}`` of ``text``: yes / y / true keep the environment,
    anything else rejects it; no ``\\boxed{}`` at all is NO_VERDICT (kept, as the reference
    does when the validator gives no verdict)."""
    found = _BOXED_RE.findall(text or "")
    if not found:
        return Verdict.NO_VERDICT
    return Verdict.ACCEPT if found[-1].strip().lower() in ACCEPT_WORDS else Verdict.REJECT
