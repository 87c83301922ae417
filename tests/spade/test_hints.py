"""Hint injection, cleaning, leak rejection and the two hint modes."""

import pytest

from spade_jax.spade import hints as H
from spade_jax.spade import prompts as P


def test_inject_hint_golden():
    assert H.inject_hint("You see a door.", "Try the key.") == (
        "You see a door.\n\nHINT: Try the key."
    )


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("<think>the answer is 7</think>\nHint: Count the corners first.",
         "Count the corners first."),
        ('```json\n{"hint": "Use parity."}\n```', "Use parity."),
        ('"Work backwards from the goal."', "Work backwards from the goal."),
        ("**Hint:** Track\nthe   parity.", "Track the parity."),
        ("", None),
        ("<think>only thinking", None),
        (None, None),
    ],
)
def test_clean_hint(raw, expected):
    assert H.clean_hint(raw) == expected


def test_clean_hint_caps_words():
    assert H.clean_hint("word " * 150) == " ".join(["word"] * H.MAX_HINT_WORDS)


def test_resolve_hint_rejects_leaks():
    solution = "\\boxed{fill A} \\boxed{pour A B}"
    leak = H.resolve_hint("self", "Just fill a pour a b.", solution)
    assert leak == H.HintResult(None, "leak")
    assert H.resolve_hint("self", "The code is 4821.", "4821").reason == "leak"
    ok = H.resolve_hint("self", "Hint: think about what fits in the larger jug.", solution)
    assert ok.hint == "think about what fits in the larger jug."
    assert H.resolve_hint("self", "  ", solution) == H.HintResult(None, "empty")


def test_designer_mode_uses_env_hint():
    result = H.resolve_hint("designer", "Corners are safe.", solution=None)
    assert result == H.HintResult("Corners are safe.")
    with pytest.raises(ValueError, match="hint mode"):
        H.resolve_hint("external", "x", None)


def test_self_mode_prompt_and_leak_check_are_exposed():
    assert H.hint_messages("class AEnv: pass") == P.hint_messages("class AEnv: pass")
    assert H.hint_leaks("press 4821 now", "\\boxed{4821}")
