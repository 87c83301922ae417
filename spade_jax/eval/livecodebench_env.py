"""LiveCodeBench problem as a one-step environment under our contract (self-contained module).

This file is environment code (standard library only); `BOUND_KWARGS` carries one problem of
LiveCodeBench's public `code_generation_lite` files: `prompt` (the user message shown),
`public_tests` (a list of {"input", "output", "testtype"}), `private_tests` (the file's raw
field: JSON text, or base64 of zlib of a pickled JSON string), `func_name` (LeetCode-style
problems; None for standard input) and `timeout_s` per test (LiveCodeBench's 6 s).

Scoring follows LiveCodeBench's `lcb_runner/evaluation/testing_util.py`: the code is the last
```python block of the reply (else the whole reply, as the reference's extractor); every public
then private test must pass. A standard-input program runs once per test with that input on
stdin (and `open(...)` reading it) and its stdout must equal the expected output line by line
after stripping, or, for a line that differs, as Decimal numbers element-wise. A functional
problem calls `Solution().<func_name>` (or a module-level function) with the test's
JSON-per-line arguments and compares the result (a tuple read as a list) with the JSON expected
value. The reward is 1 if all tests pass, else 0. Run inline: the sandbox worker is the
isolation boundary.
"""

import base64
import contextlib
import decimal
import io
import json
import pickle
import re
import signal
import sys
import threading
import zlib

BOUND_KWARGS: dict = {}

# The imports LiveCodeBench puts in front of every program (testing_util.import_string).
PRELUDE_MODULES = ("string", "re", "datetime", "collections", "heapq", "bisect", "copy",
                   "math", "random", "statistics", "itertools", "functools", "operator", "io",
                   "sys", "json")
PRELUDE = (
    "".join(f"from {name} import *\n" for name in (*PRELUDE_MODULES, "builtins", "typing"))
    + "".join(f"import {name}\n" for name in PRELUDE_MODULES)
    + "sys.setrecursionlimit(50000)\n"
)
_PYTHON_BLOCK = re.compile(r"```python\s*\n(.*?)\n```", re.DOTALL)


class _TestTimeout(BaseException):
    """Raised by the per-test timer; a BaseException so `except Exception` cannot swallow it."""


def extract_code(reply: str) -> str:
    """The last ```python block of `reply`, else the whole reply (the reference's rule)."""
    blocks = _PYTHON_BLOCK.findall(reply)
    return blocks[-1] if blocks else reply


def decode_tests(raw) -> list:
    """Test cases from a list, JSON text, or LiveCodeBench's base64 / zlib / pickle encoding."""
    if isinstance(raw, list):
        return raw
    if not raw:
        return []
    try:
        return json.loads(raw)
    except json.JSONDecodeError:
        decoded = pickle.loads(zlib.decompress(base64.b64decode(raw.encode())))
        return json.loads(decoded) if isinstance(decoded, str) else decoded


def lines_match(produced: str, expected: str) -> bool:
    """Whether stdout matches: same stripped lines, each equal as text or as Decimal numbers."""
    got, want = _stripped_lines(produced), _stripped_lines(expected)
    if len(got) != len(want):
        return False
    return all(a == b or _same_numbers(a, b) for a, b in zip(got, want, strict=True))


def run_stdio(code: str, stdin: str, timeout_s: float) -> tuple:
    """Run `code` as a program on `stdin`: (stdout, None) or (None, "<verdict>")."""
    sink = io.StringIO()
    namespace = {"__name__": "__main__", "open": lambda *args, **kwargs: io.StringIO(stdin)}
    saved_stdin = sys.stdin
    sys.stdin = io.TextIOWrapper(io.BytesIO(stdin.encode()))
    try:
        with _timer(timeout_s), contextlib.redirect_stdout(sink):
            try:
                exec(compile(PRELUDE + code, "<solution>", "exec"), namespace)  # noqa: S102
            except SystemExit:
                pass
    except _TestTimeout:
        return None, "time limit exceeded"
    except BaseException as error:  # the program's own failure
        return None, f"runtime error: {type(error).__name__}: {error}"[:300]
    finally:
        sys.stdin = saved_stdin
    return sink.getvalue(), None


def run_functional(code: str, func_name: str, tests: list, timeout_s: float) -> str:
    """Call the solution on each test; "passed" or the first failure's verdict."""
    namespace = {"__name__": "solution"}
    try:
        with _timer(timeout_s), contextlib.redirect_stdout(io.StringIO()):
            exec(compile(PRELUDE + code, "<solution>", "exec"), namespace)  # noqa: S102
            owner = namespace["Solution"]() if "class Solution" in code else None
    except _TestTimeout:
        return "time limit exceeded while loading"
    except BaseException as error:
        return f"compile error: {type(error).__name__}: {error}"[:300]
    method = getattr(owner, func_name, None) if owner is not None else namespace.get(func_name)
    if method is None:
        return f"no function {func_name}"
    for index, test in enumerate(tests):
        arguments = [json.loads(line) for line in test["input"].split("\n")]
        expected = json.loads(test["output"])
        try:
            with _timer(timeout_s), contextlib.redirect_stdout(io.StringIO()):
                result = method(*arguments)
        except _TestTimeout:
            return f"test {index}: time limit exceeded"
        except BaseException as error:
            return f"test {index}: runtime error: {type(error).__name__}: {error}"[:300]
        if isinstance(result, tuple):
            result = list(result)
        if result != expected:
            return f"test {index}: wrong answer"
    return "passed"


def grade(code: str, tests: list, func_name, timeout_s: float) -> str:
    """"passed" if `code` passes every test, else the first failure's verdict."""
    if func_name:
        return run_functional(code, func_name, tests, timeout_s)
    for index, test in enumerate(tests):
        produced, failure = run_stdio(code, test["input"], timeout_s)
        if failure is not None:
            return f"test {index}: {failure}"
        if not lines_match(produced, test["output"]):
            return f"test {index}: wrong answer"
    return "passed"


class LiveCodeBenchEnv:
    """One LiveCodeBench problem: the statement in, a program out, reward 1 if all tests pass."""

    def __init__(self, max_turns: int = 1, **kwargs):
        kwargs = {**BOUND_KWARGS, **kwargs}
        self.max_turns = max_turns
        self.question_id = kwargs["question_id"]
        self.prompt = kwargs["prompt"]
        self.public_tests = kwargs["public_tests"]
        self.private_tests = kwargs["private_tests"]
        self.func_name = kwargs.get("func_name")
        self.timeout_s = float(kwargs.get("timeout_s", 6.0))
        self.done = True

    def reset(self, seed=None, options=None):
        """Show the problem; the seed only labels the sample."""
        self.done = False
        return self.prompt, {"question_id": self.question_id}

    def step(self, action):
        """Run the reply's program on every test; the episode ends."""
        if self.done:
            raise RuntimeError("call reset() before step()")
        self.done = True
        tests = decode_tests(self.public_tests) + decode_tests(self.private_tests)
        verdict = grade(extract_code(str(action)), tests, self.func_name, self.timeout_s)
        passed = verdict == "passed"
        info = {"question_id": self.question_id, "passed": passed, "verdict": verdict,
                "tests": len(tests)}
        return "", 1.0 if passed else 0.0, True, False, info

    def close(self):
        """Nothing to release."""


@contextlib.contextmanager
def _timer(timeout_s: float):
    """Raise `_TestTimeout` in the body after `timeout_s` (main thread only; else no limit)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGALRM, _raise_timeout)
    signal.setitimer(signal.ITIMER_REAL, timeout_s)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def _raise_timeout(signum, frame):
    raise _TestTimeout()


def _stripped_lines(text: str) -> list:
    return [line.strip() for line in text.strip().split("\n")]


def _same_numbers(a: str, b: str) -> bool:
    """Whether two lines hold the same numbers field by field (False if a field is not one)."""
    try:
        return [decimal.Decimal(x) for x in a.split()] == [decimal.Decimal(x) for x in b.split()]
    except decimal.InvalidOperation:
        return False
