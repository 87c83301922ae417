"""A question with one reference answer as a one-step environment (self-contained env module).

This file is environment code: standard library only, plus `math_verify` when `scoring` is
"math". `BOUND_KWARGS` carries `prompt` (the user message shown), `answer` and `scoring`:
- "math" (AIME): the last `\\boxed{...}` without nested braces is compared with the answer by
  math-verify (`verify(parse("\\boxed{gold}"), parse("\\boxed{pred}"))`), falling back to an
  integer or exact-string comparison, as the reference's `eval_offline/suites/aime.py` does.
- "choice" (GPQA): the letter of the last `\\boxed{A-D}`, else of the first "answer is X" /
  "Answer: X", must equal the answer letter, as in `eval_offline/suites/gpqa_diamond.py`.
The reward is 1 when correct, else 0; the episode ends after one answer.
"""

import re

BOUND_KWARGS: dict = {}

MATH_VERIFY_INSTALL = "pip install math-verify"
SCORINGS = ("math", "choice")

_BOXED_FLAT = re.compile(r"\\boxed\{([^{}]+)\}")
_BOXED_LETTER = re.compile(r"\\boxed\{([A-D])\}")
_ANSWER_LETTER = re.compile(r"(?:answer is|Answer:)\s*([A-D])\b", re.IGNORECASE)


def boxed_answer(text: str):
    """The stripped content of the last `\\boxed{...}` that holds no braces, or None."""
    found = _BOXED_FLAT.findall(text)
    return found[-1].strip() if found else None


def math_equal(predicted, gold: str) -> bool:
    """Whether `predicted` equals `gold` for math-verify; int / string equality if it fails."""
    if predicted is None:
        return False
    try:
        from math_verify import parse, verify
    except ImportError as error:
        raise ImportError(f"AIME scoring needs math-verify: {MATH_VERIFY_INSTALL}") from error
    try:
        return bool(verify(parse(f"\\boxed{{{gold}}}"), parse(f"\\boxed{{{predicted}}}")))
    except Exception:  # math-verify could not parse or compare: fall back as the reference
        pass
    try:
        return int(predicted.strip()) == int(gold.strip())
    except ValueError:
        return predicted.strip() == gold.strip()


def choice_letter(text: str):
    """The letter of the last `\\boxed{A-D}`, else of the first "answer is X"; or None."""
    boxed = _BOXED_LETTER.findall(text)
    if boxed:
        return boxed[-1]
    stated = _ANSWER_LETTER.search(text)
    return stated.group(1).upper() if stated else None


class AnswerEnv:
    """One question; the agent's single reply is scored against the reference answer."""

    def __init__(self, max_turns: int = 1, **kwargs):
        kwargs = {**BOUND_KWARGS, **kwargs}
        self.max_turns = max_turns
        self.prompt = kwargs["prompt"]
        self.answer = str(kwargs["answer"])
        self.scoring = kwargs.get("scoring", "math")
        if self.scoring not in SCORINGS:
            raise ValueError(f"scoring must be one of {SCORINGS}, got {self.scoring!r}")
        self.done = True

    def reset(self, seed=None, options=None):
        """Show the question; the seed only labels the sample."""
        self.done = False
        return self.prompt, {}

    def step(self, action):
        """Score the reply; the episode ends."""
        if self.done:
            raise RuntimeError("call reset() before step()")
        self.done = True
        text = str(action)
        if self.scoring == "math":
            predicted = boxed_answer(text)
            correct = math_equal(predicted, self.answer)
        else:
            predicted = choice_letter(text)
            correct = predicted == self.answer
        info = {"predicted": predicted, "label": self.answer, "correct": correct}
        return "", 1.0 if correct else 0.0, True, False, info

    def solution(self):
        """The reference answer, boxed."""
        return "\\boxed{" + self.answer + "}"

    def close(self):
        """Nothing to release."""
