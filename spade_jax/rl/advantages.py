"""Agent advantages: per-environment z-score of the no-hint returns (docs/DESIGN.md §4.7).

``A_{g,i} = (R_{g,i} - mean_g) / (std_g + 1e-8)`` over the K no-hint plays of environment g
(reference ``normalize_rewards_per_game``, mode ``grpo``; population std, ddof=0). A group
whose returns are all equal carries no learning signal: its advantages are exactly 0 and it
is counted so the loop can log it. Host-side numpy: these are a few hundred floats.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

ZSCORE_EPS = 1e-8


@dataclasses.dataclass(frozen=True)
class GroupAdvantages:
    """Advantages per group (same order and lengths as the input) and group counts to log."""

    advantages: list[np.ndarray]
    n_groups: int
    n_zero_variance: int
    n_all_positive: int
    n_all_nonpositive: int


def zscore_group(returns: Sequence[float], eps: float = ZSCORE_EPS) -> np.ndarray:
    """Z-score of one group's returns; all zeros when the returns are all equal."""
    values = np.asarray(returns, dtype=np.float64).reshape(-1)
    if values.size == 0:
        raise ValueError("cannot normalise an empty group of returns")
    if not np.all(np.isfinite(values)):
        raise ValueError(f"non-finite returns in group: {values.tolist()}")
    if np.all(values == values[0]):
        return np.zeros_like(values)
    return (values - values.mean()) / (values.std() + eps)


def group_zscore_advantages(
    groups: Sequence[Sequence[float]], eps: float = ZSCORE_EPS
) -> GroupAdvantages:
    """Per-environment z-scores of ``groups`` (one sequence of returns per environment).

    Groups may differ in size. ``n_all_positive`` / ``n_all_nonpositive`` count groups the
    Agent always won / never won (the reference's ``all_positive`` / ``all_zero`` logs).
    """
    advantages = [zscore_group(group, eps) for group in groups]
    arrays = [np.asarray(group, dtype=np.float64).reshape(-1) for group in groups]
    return GroupAdvantages(
        advantages=advantages,
        n_groups=len(arrays),
        n_zero_variance=sum(bool(np.all(a == a[0])) for a in arrays),
        n_all_positive=sum(bool(np.all(a > 0)) for a in arrays),
        n_all_nonpositive=sum(bool(np.all(a <= 0)) for a in arrays),
    )
