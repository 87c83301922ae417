"""HumanEval problem as a one-step environment under our contract (self-contained env module).

This file is environment code (standard library only); `BOUND_KWARGS` carries the problem.
The agent's completion is taken from its last ```python block, else its last \\boxed{...},
else the whole reply; it may be the function body or the whole function. The program
`prompt + completion + test + check(entry_point)` then runs, and the reward is 1 if it exits
cleanly, else 0.

Execution modes (`execution=`):
- "inline": exec in this process under a SIGALRM timer. This is what the sandbox runs: the
  worker process is the isolation boundary.
- "subprocess": a fresh `python -I -S` (standard library only) in a temporary directory,
  with a timeout and rlimits. A host-side fallback for when no sandbox is available; it is
  not a sandbox.
"""

import contextlib
import io
import os
import re
import resource
import signal
import subprocess
import sys
import tempfile
import threading
import uuid

BOUND_KWARGS: dict = {}

INSTRUCTIONS = (
    "Complete the following Python function. Reply with the completed function (or only its "
    "body) in a ```python block.\n\n```python\n{prompt}```"
)
INTERPRETER_STARTUP_S = 5.0  # extra wall time for a fresh interpreter in "subprocess" mode
MEMORY_LIMIT_BYTES = 4 << 30

_CODE_BLOCK = re.compile(r"```(?:python|py|Python)?[ \t]*\n(.*?)```", re.DOTALL)


class _ProgramTimeout(BaseException):
    """Raised by the inline timer; a BaseException so `except Exception` cannot swallow it."""


def extract_completion(action: str) -> str:
    """The code in the last ```python block, else the last \\boxed{...}, else the reply."""
    blocks = _CODE_BLOCK.findall(action)
    if blocks:
        return blocks[-1]
    boxed = last_boxed(action)
    return boxed if boxed is not None else action


def last_boxed(text: str):
    """Content of the last `\\boxed{...}` (balanced braces), or None."""
    start = text.rfind("\\boxed{")
    if start < 0:
        return None
    depth, begin = 0, start + len("\\boxed{")
    for index in range(begin - 1, len(text)):
        if text[index] == "{":
            depth += 1
        elif text[index] == "}":
            depth -= 1
            if depth == 0:
                return text[begin:index]
    return None


def build_program(problem: dict, completion: str) -> str:
    """The test program: prompt and completion (body or whole function), tests, check call."""
    entry_point = problem["entry_point"]
    defines_function = re.search(rf"^\s*def\s+{re.escape(entry_point)}\s*\(", completion, re.M)
    joiner = "\n" if defines_function else ""
    return f"{problem['prompt']}{joiner}{completion}\n\n{problem['test']}\n\ncheck({entry_point})\n"


def run_inline(program: str, timeout_s: float) -> str:
    """Exec `program` here; "passed", "failed: <error>" or "timed out"."""
    use_timer = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGALRM, _raise_timeout) if use_timer else None
    sink = io.StringIO()
    saved_stdin = sys.stdin
    try:
        sys.stdin = io.StringIO()
        if use_timer:
            signal.setitimer(signal.ITIMER_REAL, timeout_s)
        with contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink):
            exec(compile(program, "<humaneval>", "exec"), {"__name__": "__humaneval__"})
        return "passed"
    except _ProgramTimeout:
        return "timed out"
    except BaseException as error:  # the program's own failure, SystemExit included
        return f"failed: {type(error).__name__}: {error}"[:500]
    finally:
        if use_timer:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous)
        sys.stdin = saved_stdin


def run_subprocess(program: str, timeout_s: float) -> str:
    """Run `program` in a fresh interpreter in a temp dir; same verdicts as `run_inline`."""
    finished = f"finished-{uuid.uuid4().hex}"  # an early sys.exit(0) must not pass
    with tempfile.TemporaryDirectory() as workdir:
        path = os.path.join(workdir, "program.py")
        with open(path, "w") as handle:
            handle.write(f"{program}\nprint({finished!r})\n")
        try:
            done = subprocess.run(
                [sys.executable, "-I", "-S", path],
                cwd=workdir,
                capture_output=True,
                text=True,
                timeout=timeout_s + INTERPRETER_STARTUP_S,
                preexec_fn=_limit_resources,
            )
        except subprocess.TimeoutExpired:
            return "timed out"
    if done.returncode == 0 and done.stdout.rstrip().endswith(finished):
        return "passed"
    lines = done.stderr.strip().splitlines() or [f"exit code {done.returncode}"]
    return f"failed: {lines[-1]}"[:500]


class HumanEvalEnv:
    """One HumanEval problem: the prompt in, a completion out, reward 1 if the tests pass."""

    def __init__(self, max_turns: int = 1, **kwargs):
        kwargs = {**BOUND_KWARGS, **kwargs}
        self.max_turns = max_turns
        self.problem = kwargs["problem"]
        self.timeout_s = float(kwargs.get("timeout_s", 3.0))
        self.execution = kwargs.get("execution", "inline")
        if self.execution not in ("inline", "subprocess"):
            raise ValueError(f"execution must be 'inline' or 'subprocess', got {self.execution!r}")

    def reset(self, seed=None, options=None):
        """Show the prompt; the problem is fixed, the seed only labels the sample."""
        self.done = False
        info = {"task_id": self.problem["task_id"], "entry_point": self.problem["entry_point"]}
        return INSTRUCTIONS.format(prompt=self.problem["prompt"]), info

    def step(self, action):
        """Run the completion against the problem's tests; the episode ends."""
        if self.done:
            raise RuntimeError("step() after the episode ended; call reset()")
        self.done = True
        program = build_program(self.problem, extract_completion(str(action)))
        runner = run_inline if self.execution == "inline" else run_subprocess
        result = runner(program, self.timeout_s)
        passed = result == "passed"
        info = {"task_id": self.problem["task_id"], "passed": passed, "result": result}
        return "", 1.0 if passed else 0.0, True, False, info

    def solution(self):
        """The canonical solution (a function body) as a ```python block."""
        return f"```python\n{self.problem['canonical_solution']}```"

    def close(self):
        """Nothing to release."""


def _raise_timeout(signum, frame):
    raise _ProgramTimeout()


def _limit_resources():
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT_BYTES, MEMORY_LIMIT_BYTES))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    resource.setrlimit(resource.RLIMIT_FSIZE, (16 << 20, 16 << 20))
