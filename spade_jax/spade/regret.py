"""Hint regret, its standard error, win rates and delayed-Designer helpers (docs/DESIGN.md §4.6).

``regret = mean(R_hint) - mean(R_nohint)`` with matched timing: both sets of plays come from
the same policy snapshot (the regen cycle, window offset 0), and play ``i`` of both sets uses
the same environment seed, so the per-seed differences give a paired standard error.

With a Designer ``delay`` of d cycles the Agent keeps playing the same environments for d
cycles; `WindowReturns` holds those plays keyed by offset, from which the reference computes
the window win rate (plateau input) and, in its ``regret`` variant, the accumulated regret.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import numpy as np


def _as_returns(values: Sequence[float], what: str) -> np.ndarray:
    array = np.asarray(values, dtype=np.float64).reshape(-1)
    if array.size == 0:
        raise ValueError(f"{what} is empty: at least one play is needed")
    if not np.all(np.isfinite(array)):
        raise ValueError(f"{what} contains non-finite returns: {array.tolist()}")
    return array


def regret_standard_error(r_hint: Sequence[float], r_nohint: Sequence[float]) -> float:
    """Standard error of the regret `mean(R_hint) - mean(R_nohint)`.

    Paired (same length, play i of both sets shares seed i): ``std(R_hint_i - R_i) / sqrt(K)``
    with the sample standard deviation (ddof=1). With unequal counts (the reference's 16 hint
    vs 8 plain plays) pairing is impossible and the unpaired ``sqrt(s_h^2/K_h + s_n^2/K_n)``
    is returned. NaN when a set has a single play (no variance estimate).
    """
    hint = _as_returns(r_hint, "R_hint")
    nohint = _as_returns(r_nohint, "R_nohint")
    if hint.size == nohint.size:
        if hint.size < 2:
            return math.nan
        return float(np.std(hint - nohint, ddof=1) / math.sqrt(hint.size))
    if hint.size < 2 or nohint.size < 2:
        return math.nan
    return float(
        math.sqrt(np.var(hint, ddof=1) / hint.size + np.var(nohint, ddof=1) / nohint.size)
    )


@dataclasses.dataclass(frozen=True)
class PlayStats:
    """Summary of one environment's plays in one cycle.

    ``mean_return`` (the mean no-hint return) is the plateau input of the reward variants;
    ``win_rate`` (share of no-hint plays with return > 0) is what memory stores and retrieves.
    ``r_hint``, ``regret`` and ``regret_se`` are None in a cycle without hint plays of the
    environment (`spade.hint_plays_when`).
    """

    env_id: str
    skill: str
    r_hint: float | None
    r_nohint: float
    regret: float | None
    regret_se: float | None
    win_rate: float
    mean_return: float
    n_hint: int
    n_nohint: int
    n_failed: int

    def to_dict(self) -> dict[str, float | int | str | None]:
        return dataclasses.asdict(self)


def _mean_or_zero(values: np.ndarray) -> float:
    """Mean of the returns, 0 when there are none (reference ``_mean_or_zero``)."""
    return float(values.mean()) if values.size else 0.0


def play_stats(
    env_id: str,
    skill: str,
    returns_nohint: Sequence[float],
    returns_hint: Sequence[float] | None,
    n_failed: int = 0,
) -> PlayStats:
    """`PlayStats` from the no-hint and hint returns of one environment that count.

    ``returns_hint`` None: no hint plays this cycle. A side whose plays were all dropped
    (failed, `spade.failed_plays=drop`) has mean 0, as in the reference. ``n_failed`` counts
    crashed or timed-out plays; it is carried for logging.
    """
    nohint = np.asarray(returns_nohint, np.float64).reshape(-1)
    if not np.all(np.isfinite(nohint)):
        raise ValueError(f"no-hint returns of {env_id} contain non-finite returns: "
                         f"{nohint.tolist()}")
    r_nohint = _mean_or_zero(nohint)
    r_hint = regret_value = regret_se = None
    n_hint = 0
    if returns_hint is not None:
        hint = np.asarray(returns_hint, np.float64).reshape(-1)
        if not np.all(np.isfinite(hint)):
            raise ValueError(f"hint returns of {env_id} contain non-finite returns: "
                             f"{hint.tolist()}")
        r_hint, n_hint = _mean_or_zero(hint), int(hint.size)
        regret_value = r_hint - r_nohint
        regret_se = (regret_standard_error(hint, nohint) if hint.size and nohint.size
                     else math.nan)
    return PlayStats(
        env_id=env_id,
        skill=skill,
        r_hint=r_hint,
        r_nohint=r_nohint,
        regret=regret_value,
        regret_se=regret_se,
        win_rate=float(np.mean(nohint > 0)) if nohint.size else 0.0,
        mean_return=r_nohint,
        n_hint=n_hint,
        n_nohint=int(nohint.size),
        n_failed=int(n_failed),
    )


@dataclasses.dataclass
class WindowReturns:
    """No-hint returns of one environment over the Designer delay window, keyed by offset.

    Offset 0 is the regen cycle (where the hint plays were also collected); offsets
    1..delay-1 are the later cycles that replay the same environment.
    """

    by_offset: dict[int, list[float]] = dataclasses.field(default_factory=dict)

    def add(self, offset: int, returns: Sequence[float]) -> None:
        """Append the returns of the plays made ``offset`` cycles after the regen cycle."""
        if offset < 0:
            raise ValueError(f"window offset must be >= 0, got {offset}")
        self.by_offset.setdefault(int(offset), []).extend(float(r) for r in returns)

    def all_returns(self) -> list[float]:
        """Every play of the window, in offset order."""
        return [r for offset in sorted(self.by_offset) for r in self.by_offset[offset]]

    def first_offset_returns(self) -> list[float]:
        """The plays of the earliest offset present (matched timing with the hint plays)."""
        if not self.by_offset:
            return []
        return list(self.by_offset[min(self.by_offset)])


def window_mean_return(window: WindowReturns) -> float:
    """Mean return over every play of the window (reference blend's ``win_rate``); 0 if none."""
    values = window.all_returns()
    return float(np.mean(values)) if values else 0.0


def window_regret(r_hint_mean: float, window: WindowReturns, matched_timing: bool = True) -> float:
    """Regret of an environment at delayed-training time.

    ``matched_timing=True`` (our default, reference ``blend``): ``r_hint - mean(offset-0
    plays)``, free of the bias from the Agent improving during the window.
    ``matched_timing=False`` (reference ``regret`` variant, for parity runs):
    ``r_hint - mean(all window plays)``. 0 plays on the no-hint side count as mean 0, as in
    the reference's ``_mean_or_zero``.
    """
    plays = window.first_offset_returns() if matched_timing else window.all_returns()
    r_nohint = float(np.mean(plays)) if plays else 0.0
    return float(r_hint_mean) - r_nohint

