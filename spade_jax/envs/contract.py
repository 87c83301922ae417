"""The environment contract (docs/DESIGN.md §4.3) and the host-side helpers that check it.

An environment is Python source with exactly one top-level class whose name ends in `Env`:

    class SomethingEnv:
        def __init__(self, max_turns: int = 25, **kwargs): ...
        def reset(self, seed: int | None = None) -> tuple[str, dict]
        def step(self, action: str) -> tuple[str, float, bool, bool, dict]
        def solution(self) -> str      # reference answer / action script for the current seed
        def hint(self) -> str          # optional
        def close(self) -> None

Common stdlib names are pre-injected (see `sandbox/injected.py`), as are
`np`/`numpy` when installed and `ToolUseEnv` (alias `ToolUseBaseEnv`). A game's action is
the agent's reply reduced to its boxed action, `\\boxed{x}` (`boxed_action`), or the reply
when it boxes nothing; tool-use environments read `<tool_call>{json}</tool_call>` and
`<answer>...</answer>` in the reply.
"""

import math
import re

__all__ = [
    "REWARD_BOUND", "answer_leaks", "extract_code",
    "hint_leaks", "normalise_answer", "reset_problem", "solution_actions", "step_problem",
]

REWARD_BOUND = 10.0
MIN_LEAK_CHARS = 3  # shorter answers ("7", "up") occur by chance in any text

_FENCE = re.compile(r"```[ \t]*(python|py)?[ \t]*\n(.*?)(?:```|\Z)", re.DOTALL | re.IGNORECASE)
_TOOL_OR_ANSWER = re.compile(r"<tool_call>.*?</tool_call>|<answer>.*?</answer>", re.DOTALL)
# a \boxed{x} without nested braces, or wrapped in two or three brace pairs
_FLAT_BOXED = tuple(re.compile(p) for p in (
    r"\\boxed\{([^{}]+)\}", r"\\boxed\{\{([^{}]+)\}\}", r"\\boxed\{\{\{([^{}]+)\}\}\}"))


def extract_code(text: str) -> str | None:
    """The last ```python block of a model response, or the text itself if it is bare code.

    Why: the Designer answers with prose plus one fenced block; validation (V0) needs the code.
    Unlabelled fences count when no python-labelled fence exists. None when nothing is found.
    """
    if not isinstance(text, str) or not text.strip():
        return None
    blocks = [(m.group(1), m.group(2)) for m in _FENCE.finditer(text)]
    labelled = [code for label, code in blocks if label]
    chosen = labelled or [code for _, code in blocks]
    if chosen:
        code = chosen[-1].strip("\n")
        return code if code.strip() else None
    return text if re.search(r"^\s*(class|def|import|from)\s", text, re.MULTILINE) else None


def _braced(text: str, opening: int) -> int | None:
    """Index of the `}` that closes the `{` at `opening` (nested braces balanced), or None."""
    depth = 0
    for i in range(opening, len(text)):
        depth += {"{": 1, "}": -1}.get(text[i], 0)
        if depth == 0:
            return i
    return None


def _boxed_contents(text: str) -> list[str]:
    """Contents of every `\\boxed{...}` in order, with nested braces balanced."""
    contents, start = [], 0
    while (at := text.find("\\boxed{", start)) >= 0:
        opening = at + len("\\boxed")
        if (closing := _braced(text, opening)) is None:
            break
        contents.append(text[opening + 1:closing])
        start = closing + 1
    return contents


def boxed_action(reply: str) -> str:
    """The action a game's `step` receives for an Agent reply, as the reference's
    `parse_action`: the first `\\boxed{x}` without nested braces (else the braces after the
    last `\\boxed`, balanced, up to two wrapping pairs dropped) re-wrapped alone as
    `\\boxed{x}`; the reply stripped when it boxes nothing."""
    for pattern in _FLAT_BOXED:
        if found := pattern.search(reply):
            return f"\\boxed{{{found.group(1).strip()}}}"
    at = reply.rfind("\\boxed")
    opening = reply.find("{", at) if at >= 0 else -1
    closing = _braced(reply, opening) if opening >= 0 else None
    content = reply[opening + 1:closing].strip() if closing is not None else ""
    for _ in range(2):
        if content.startswith("{") and content.endswith("}"):
            content = content[1:-1].strip()
    return f"\\boxed{{{content}}}" if content else reply.strip()


def solution_actions(solution_text: str) -> list[str]:
    """Turn `solution()` text into the action script replayed by the V7 certificate.

    Each `\\boxed{x}` is one action (re-wrapped as `\\boxed{x}`); else each
    `<tool_call>...</tool_call>` / `<answer>...</answer>` block is one action; else the whole
    text is a single `\\boxed{text}` action.
    """
    text = str(solution_text)
    boxed = _boxed_contents(text)
    if boxed:
        return [f"\\boxed{{{content}}}" for content in boxed]
    blocks = _TOOL_OR_ANSWER.findall(text)
    if blocks:
        return blocks
    return [f"\\boxed{{{text.strip()}}}"]


def normalise_answer(text: str) -> str:
    """Lower-case, markup-free, single-spaced form of an answer or observation, for leak tests."""
    text = str(text)
    boxed = _boxed_contents(text)
    if boxed:
        text = " ".join(boxed)
    text = re.sub(r"</?(answer|tool_call)>", " ", text)
    return " ".join(text.lower().split())


def answer_leaks(text: str, solution: str) -> bool:
    """True when the normalised solution appears as a whole token run inside `text` (V5).

    Answers shorter than MIN_LEAK_CHARS are not tested: they match innocent text by chance.
    """
    answer = normalise_answer(solution)
    if len(answer) < MIN_LEAK_CHARS:
        return False
    haystack = " ".join(str(text).lower().split())
    return re.search(rf"(?<!\w){re.escape(answer)}(?!\w)", haystack) is not None


def hint_leaks(hint: str, solution: str) -> bool:
    """True when a hint gives the answer away, so it is rejected (docs/DESIGN.md §4.4 V5, §4.5)."""
    return answer_leaks(hint, solution)


def reset_problem(value, kinds, is_tuple: bool) -> str | None:
    """Why a worker's `reset` return value breaks the contract, or None if it is fine."""
    if not is_tuple or len(kinds) != 2:
        return f"reset() must return (observation, info), got kinds {kinds}"
    if kinds != ["str", "dict"]:
        return f"reset() must return (str, dict), got ({', '.join(kinds)})"
    if not value[0]:
        return "reset() returned an empty observation"
    return None


def step_problem(value, kinds, is_tuple: bool) -> str | None:
    """Why a worker's `step` return value breaks the contract, or None if it is fine."""
    if not is_tuple or len(kinds) != 5:
        count = len(kinds) if is_tuple else 1
        return ("step() must return a 5-tuple (obs, reward, terminated, truncated, info), "
                f"got {count} items")
    expected = ["str", "number", "bool", "bool", "dict"]
    if kinds != expected:
        return f"step() returned kinds ({', '.join(kinds)}), expected ({', '.join(expected)})"
    reward = value[1]
    if not isinstance(reward, (int, float)) or not math.isfinite(reward):
        return f"step() returned a non-finite reward {reward!r}"
    if abs(reward) > REWARD_BOUND:
        return f"step() reward {reward} outside [-{REWARD_BOUND:g}, {REWARD_BOUND:g}]"
    return None
