"""τ²-bench (retail, airline, telecom) as evaluation tasks, from the user's tau2-bench clone.

tau2-bench is not on PyPI; its tasks, databases and policies live in its repository
(github.com/sierra-research/tau2-bench), cloned to `<data_dir>/tau2-bench` (`TAU2_DIR`).
Every task of a domain's split is `tau2_env.py` bound to the clone, the domain and the task,
played `trials` times (seed = trial; category = domain). Its tools and databases are the
clone's own code (`tau2_env.import_domain`), which needs tau2-bench's small requirements
(`pip install -e .[tau2]`) and the clone visible to the sandbox workers (`sandbox_paths`).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from spade_jax.errors import MissingFileError
from spade_jax.eval import tau2_env
from spade_jax.eval.tasks import EvalTask, bound_env_code

TAU2_DIR = "tau2-bench"  # the clone, under --data_dir
DOMAINS = ("retail", "airline", "telecom")
SPLIT = "base"  # the reference's split for every domain (_tool_use_tau2.yaml)
# Files each domain reads from the clone, besides its tasks and split files.
DOMAIN_FILES = {
    "retail": ("data/tau2/domains/retail/db.json", "data/tau2/domains/retail/policy.md"),
    "airline": ("data/tau2/domains/airline/db.json", "data/tau2/domains/airline/policy.md"),
    "telecom": ("data/tau2/domains/telecom/db.toml", "data/tau2/domains/telecom/user_db.toml",
                "data/tau2/domains/telecom/main_policy.md",
                "data/tau2/domains/telecom/tech_support_manual.md"),
}
TASKS_FILE = "data/tau2/domains/{domain}/tasks.json"
SPLIT_FILE = "data/tau2/domains/{domain}/split_tasks.json"
DOMAIN_CODE = "src/tau2/domains/{domain}/environment.py"
GUIDELINES = tuple(tau2_env.USER_GUIDELINES.format(suffix=s) for s in ("", "_tools"))


def tau2_root(data_dir: str | Path | None) -> Path:
    """The tau2-bench clone under `data_dir`; MissingFileError naming it if absent."""
    if data_dir is None:
        raise MissingFileError(f"tau2 reads a clone of tau2-bench at <data_dir>/{TAU2_DIR} "
                               "and --data_dir was not given (README.md, Evaluation)")
    root = Path(data_dir).expanduser().resolve() / TAU2_DIR
    if not root.is_dir():
        raise MissingFileError(f"tau2 needs a clone of tau2-bench at {root} (README.md, "
                               "Evaluation: git clone https://github.com/sierra-research/"
                               "tau2-bench)")
    return root


def tau2_tasks(data_dir: str | Path | None, trials: int, max_steps: int, max_turns: int, *,
               domains: Sequence[str] = DOMAINS, split: str = SPLIT) -> list[EvalTask]:
    """`trials` tasks per task of each domain's `split` (category: the domain)."""
    root = tau2_root(data_dir)
    tasks = []
    for domain in domains:
        for relative in (DOMAIN_CODE.format(domain=domain), *GUIDELINES,
                         *DOMAIN_FILES.get(domain, ())):
            _required(root, relative)
        items = json.loads(_required(root, TASKS_FILE.format(domain=domain)).read_text())
        split_path = _required(root, SPLIT_FILE.format(domain=domain))
        splits = json.loads(split_path.read_text())
        if split not in splits:
            raise ValueError(f"{split_path} has no split {split!r}; it has {sorted(splits)}")
        wanted = set(splits[split])
        for item in items:
            if item["id"] not in wanted:
                continue
            code = bound_env_code(tau2_env, tau2_root=str(root), domain=domain,
                                  task_json=json.dumps(item), max_steps=max_steps)
            tasks += [EvalTask("tau2", domain, f"tau2/{domain}/{item['id']}", code, seed=trial,
                               max_turns=max_turns) for trial in range(trials)]
    return tasks


def sandbox_paths(data_dir: str | Path | None) -> tuple[str, ...]:
    """Directories the sandbox workers must read: the clone."""
    return (str(tau2_root(data_dir)),)


def _required(root: Path, relative: str) -> Path:
    path = root / relative
    if not path.is_file():
        raise MissingFileError(f"tau2 needs {path} (README.md, Evaluation, says where the "
                               "tau2-bench clone comes from)")
    return path
