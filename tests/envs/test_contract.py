"""Contract helpers: code extraction, solution scripts, leak checks, lint, seccomp program."""

import ast
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from spade_jax.envs import extract_code, hint_leaks, solution_actions
from spade_jax.envs.contract import boxed_action
from spade_jax.envs.lint import lint, parse_source
from spade_jax.envs.sandbox.isolation import Layers, SandboxConfig, SandboxUnavailable, check_policy
from spade_jax.envs.sandbox.seccomp_filter import build_program
from spade_jax.spade.prompts import GameType


def test_extract_code_takes_last_python_block_or_bare_code():
    text = "intro\n```python\nx = 1\n```\nmore\n```python\nclass AEnv:\n    pass\n```\n"
    assert extract_code(text) == "class AEnv:\n    pass"
    assert extract_code("```\nclass BEnv: pass\n```") == "class BEnv: pass"
    assert extract_code("class CEnv:\n    pass\n") == "class CEnv:\n    pass\n"
    assert extract_code("I refuse.") is None and extract_code("") is None


def test_solution_actions():
    assert solution_actions("\\boxed{3} then \\boxed{a{b}}") == ["\\boxed{3}", "\\boxed{a{b}}"]
    blocks = '<tool_call>{"name": "f"}</tool_call> x <answer>42</answer>'
    assert solution_actions(blocks) == ['<tool_call>{"name": "f"}</tool_call>', "<answer>42</answer>"]  # noqa: E501
    assert solution_actions(" left ") == ["\\boxed{left}"]


@pytest.mark.parametrize("reply, action", [
    # the reference's parse_action: the first flat \boxed{} wins, stripped, re-wrapped alone
    ("I think \\boxed{ 12 } then \\boxed{13}.", "\\boxed{12}"),
    ("\\boxed{{7}} and \\boxed{{{8}}}", "\\boxed{7}"),
    ("\\boxed{{{x}}}", "\\boxed{x}"),
    # no flat one: the braces after the last \boxed, up to two wrapping pairs dropped
    ("x \\boxed{a{b}c} y \\boxed {f{g}}", "\\boxed{f{g}}"),
    ("\\boxed{{{{a}}}}", "\\boxed{{a}}"),
    # nothing boxed (or an empty box, or unbalanced braces): the reply stripped
    ("  move north \n", "move north"),
    ("\\boxed{}", "\\boxed{}"),
    ("\\boxed{a{b}", "\\boxed{a{b}"),
])
def test_boxed_action_is_the_references_parse_action(reply, action):
    assert boxed_action(reply) == action


def test_the_game_type_says_what_step_receives():
    reply = ' <tool_call>{"name": "f", "arguments": {}}</tool_call> \\boxed{1} '
    assert GameType.TOOL_USE.agent_action(reply) == reply.strip()
    assert GameType.GAME.agent_action(reply) == "\\boxed{1}"


def test_parse_source_never_runs_two_parses_at_once(monkeypatch):
    """CPython 3.11's ast.parse corrupts its shared recursion counter when two threads parse at
    once (CI failed with "AST constructor recursion depth mismatch"); parse_source serialises."""
    real_parse, guard = ast.parse, threading.Lock()
    inside, peak = [0], [0]

    def slow_parse(source, *args, **kwargs):
        with guard:
            inside[0] += 1
            peak[0] = max(peak[0], inside[0])
        time.sleep(0.01)  # releases the GIL: an unserialised caller would overlap here
        with guard:
            inside[0] -= 1
        return real_parse(source, *args, **kwargs)

    monkeypatch.setattr(ast, "parse", slow_parse)
    with ThreadPoolExecutor(4) as pool:
        trees = list(pool.map(lambda i: parse_source(f"x = {i}"), range(16)))
    assert peak[0] == 1
    assert [tree.body[0].value.value for tree in trees] == list(range(16))
    assert isinstance(parse_source("f(1)", mode="eval"), ast.Expression)


def test_hint_leaks():
    assert hint_leaks("The code is 537, try it", "\\boxed{537}")
    assert not hint_leaks("Try a binary search over 10..999", "\\boxed{537}")
    assert not hint_leaks("Think about 5375", "537")
    assert not hint_leaks("go up 1 step", "1")  # too short to test


def test_lint_flags_escapes_and_imports():
    code = ("import os\nfrom subprocess import run\nx = ().__class__.__base__.__subclasses__()\n"
            "open('f')\ngetattr(x, '__globals__')\nimport random\n")
    problems = " ".join(lint(ast.parse(code)))
    for needle in ("'os'", "'subprocess'", "__base__", "__subclasses__", "open()", "getattr"):
        assert needle in problems
    assert "random" not in problems


def test_policy_refuses_rlimits_alone():
    bare = Layers(bwrap=False, seccomp=True, rlimits=("as",))
    try:
        check_policy(SandboxConfig(), bare)
    except SandboxUnavailable as exc:
        assert "allow_unsafe" in str(exc)
    else:
        raise AssertionError("policy accepted rlimits alone")
    check_policy(SandboxConfig(allow_unsafe=True), bare)


def test_seccomp_program_is_well_formed():
    for arch in ("x86_64", "aarch64"):
        program = build_program(arch)
        assert len(program) % 8 == 0 and len(program) // 8 < 4096


def test_probe_reports_all_layers(pool):
    assert pool.layers.bwrap and pool.layers.seccomp
    assert set(pool.layers.rlimits) >= {"as", "cpu", "fsize", "nofile", "core"}
