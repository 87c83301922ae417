"""reasoning-gym categories as evaluation tasks (host side).

Each category is one environment text (`reasoning_gym_env.py` bound to the dataset name,
config, dataset seed and size); its tasks are the seeds 0..size-1, one item each, scored by
the dataset's own `score_answer`. The scorer reads model text, so it runs in the sandbox too.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from spade_jax.eval import reasoning_gym_env
from spade_jax.eval.tasks import EvalTask, bound_env_code

# Cheap to generate, and every item has a reference answer that its scorer rates 1.
DEFAULT_CATEGORIES = (
    "basic_arithmetic",
    "chain_sum",
    "leg_counting",
    "letter_counting",
    "number_sorting",
    "word_sorting",
    "spell_backward",
    "gsm_symbolic",
    "simple_equations",
    "family_relationships",
)
REASONING_GYM_INSTALL = reasoning_gym_env.REASONING_GYM_INSTALL


def available_categories() -> list[str]:
    """Every dataset name registered in the installed reasoning-gym."""
    try:
        from reasoning_gym.factory import DATASETS
    except ImportError as error:
        raise ImportError(f"reasoning-gym evaluation needs: {REASONING_GYM_INSTALL}") from error
    return sorted(DATASETS)


def unknown_categories(categories: Sequence[str]) -> list[str]:
    """The names in `categories` the installed reasoning-gym does not know (an ImportError if
    it is not installed)."""
    known = set(available_categories())
    return [name for name in categories if name not in known]


def reasoning_gym_tasks(
    categories: Sequence[str] = DEFAULT_CATEGORIES,
    size: int = 50,
    dataset_seed: int = 0,
    configs: Mapping[str, Mapping] | None = None,
) -> list[EvalTask]:
    """`size` tasks per category (seeds 0..size-1); `configs[name]` overrides dataset options."""
    unknown = unknown_categories(categories)
    if unknown:
        raise ValueError(f"unknown reasoning-gym categories {unknown}; see available_categories()")
    configs = configs or {}
    tasks = []
    for name in categories:
        code = bound_env_code(
            reasoning_gym_env,
            name=name,
            config=dict(configs.get(name, {})),
            dataset_seed=dataset_seed,
            size=size,
        )
        for seed in range(size):
            tasks.append(
                EvalTask(
                    suite="reasoning_gym",
                    category=name,
                    task_id=f"{name}/{seed}",
                    code=code,
                    seed=seed,
                    max_turns=1,
                )
            )
    return tasks
