"""Validation gate: the good environment passes; each broken variant fails the named check."""

import pytest

from spade_jax.envs import validate
from tests.envs.conftest import case

GOOD = case("good_guess")


def variant(old: str, new: str) -> str:
    assert old in GOOD, old
    return GOOD.replace(old, new)


STEP_RETURN = 'return "Correct!", 1.0, True, False, {"turn": self.turn}'
BROKEN = {
    "no code": ("V0", "Sorry, I cannot write that."),
    "syntax error": ("V1", "```python\nclass BrokenEnv(:\n    pass\n```"),
    "banned import": ("V1", "import os\n" + GOOD),
    "dunder escape": ("V1", GOOD + "\nX = ().__class__.__base__.__subclasses__()\n"),
    "no Env class": ("V2", GOOD.replace("class GuessNumberEnv", "class GuessNumber")),
    "two Env classes": ("V2", GOOD + "\nclass OtherEnv:\n    pass\n"),
    "raises in __init__": ("V2", variant("self.max_turns = max_turns", "raise ValueError('no')")),
    "4-tuple": ("V3", variant('return "Please answer with \\\\boxed{N}.", -0.1, False, '
                              'self.turn >= self.max_turns, {}', 'return "x", 0.0, False, {}')),
    "NaN reward": ("V3", variant("-0.1, False, self.turn", "float('nan'), False, self.turn")),
    "non-string observation": ("V3", variant('return f"{guess} is wrong', 'return 7 or f"{guess}')),
    "10 MB observation": ("V3", variant('return "Please answer', 'return "x" * 10_000_000 + "Please')),  # noqa: E501
    "empty first observation": ("V3", variant('return ("Guess the hidden', 'return ("" if True else "Guess the hidden')),  # noqa: E501
    "hangs in step": ("V3", variant("self.turn += 1", "while True:\n            pass")),
    "nondeterministic": ("V4", variant("random.seed(seed)", "random.seed()")),
    "answer in observation": ("V5", variant('return ("Guess the hidden', 'return (f"Secret {self.target}. " "Guess the hidden')),  # noqa: E501
    # ~0.17 s a step from turn 2 on: ~4 s a random episode, against a 1 s liveness budget,
    # and a step far inside the 3 s call timeout even on a loaded CPU (0.45 s steps once took
    # 3 s in a contended CI run and failed V4's determinism run first). The environment may
    # not import time, so the work is a busy loop.
    "slow steps": ("V6", variant("self.turn += 1", "self.turn += 1\n        if self.turn > 1:\n"
                                 "            sum(range(10_000_000))")),
    "wrong solution": ("V7", variant("return f\"\\\\boxed{{{self.target}}}\"",
                                     "return f\"\\\\boxed{{{self.target + 1}}}\"")),
    "never terminates": ("V7", variant(STEP_RETURN, 'return "Correct!", 1.0, False, False, {}')),
    "trivial": ("V7", variant("if guess == self.target:", "if True:")),
}


def test_good_environment_passes(pool):
    report = validate("Here you go:\n```python\n" + GOOD + "\n```", pool=pool)
    assert report.ok, report.failures
    assert report.env_class == "GuessNumberEnv"
    assert set(report.timings) == {"V1/V2", "V2/V3", "V5", "V4", "V6", "V7"}


@pytest.mark.parametrize("name", list(BROKEN))
def test_broken_environment_fails_named_check(pool, name):
    check, text = BROKEN[name]
    report = validate(text, pool=pool, liveness_budget_s=1.0)
    assert not report.ok
    assert report.failures[0][0] == check, report.failures
