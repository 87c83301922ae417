"""Delayed Designer samples, trained `spade.designer_delay` cycles late (docs/DESIGN.md §4.6).

With a delay of d cycles, a Designer sample written at regen cycle t waits until cycle t + d.
Meanwhile the Agent keeps playing its environment (the pool lives `regen_interval` cycles, and
memory may replay it), and every no-hint return is collected in the sample's
`regret.WindowReturns`. When the sample is due its reward is computed from the whole window,
as the reference's `recompute_delayed_env_rewards_*` does: the win rate is the mean over every
window play; the regret keeps matched timing (hint plays against the no-hint plays of the regen
cycle) unless `spade.matched_timing` is off (the reference `regret` variant's window mean).
The sample keeps its rollout log-probs as `behaviour_logp`: when it is trained, its TIS weight
min(exp(train logp - behaviour_logp), train.tis_cap) corrects for the d updates since the
policy wrote it (the reference's `spade_delayed_tis`).
"""

from __future__ import annotations

import dataclasses

from spade_jax.spade import regret
from spade_jax.spade.batch import TrainSample
from spade_jax.spade.rewards import DesignerOutcome, DesignerStatus


@dataclasses.dataclass
class PendingDesign:
    """One Designer sample waiting for its due cycle, with what its reward will need."""

    due: int
    cycle: int  # the regen cycle that wrote it (window offset 0)
    sample: TrainSample  # advantage filled in when due
    skill: str
    status: DesignerStatus  # at design time
    env_id: str
    r_hint: float = 0.0
    window: regret.WindowReturns = dataclasses.field(default_factory=regret.WindowReturns)

    def to_json(self) -> dict:
        return {"due": self.due, "cycle": self.cycle, "sample": self.sample.to_json(),
                "skill": self.skill, "status": self.status, "env_id": self.env_id,
                "r_hint": self.r_hint,
                "window": {str(k): v for k, v in self.window.by_offset.items()}}

    @classmethod
    def from_json(cls, data: dict) -> PendingDesign:
        window = regret.WindowReturns({int(k): [float(r) for r in v]
                                       for k, v in data["window"].items()})
        return cls(int(data["due"]), int(data["cycle"]), TrainSample.from_json(data["sample"]),
                   data["skill"], DesignerStatus(data["status"]), data["env_id"],
                   float(data["r_hint"]), window)


def record_plays(pending: list[PendingDesign], cycle: int,
                 nohint_returns: dict[str, list[float]]) -> None:
    """Add this cycle's no-hint returns of each waiting sample's environment to its window.

    The window of a sample is its regen cycle and the `delay - 1` cycles after it.
    """
    for design in pending:
        offset = cycle - design.cycle
        in_window = offset < max(1, design.due - design.cycle)
        if (design.status != DesignerStatus.INVALID and in_window
                and design.env_id in nohint_returns):
            design.window.add(offset, nohint_returns[design.env_id])


def due_outcome(design: PendingDesign, matched_timing: bool = True) -> DesignerOutcome:
    """The reward input of a due sample, from its whole delay window, with the status of its
    regen cycle (as the reference, which flags only the timeouts of that cycle's plays)."""
    if design.status == DesignerStatus.INVALID:
        return DesignerOutcome(design.skill, design.status)
    return DesignerOutcome(
        design.skill, design.status,
        regret=regret.window_regret(design.r_hint, design.window, matched_timing),
        win_rate=regret.window_mean_return(design.window),
        n_plays=len(design.window.all_returns()))


def split_due(pending: list[PendingDesign], cycle: int,
              flush: bool = False) -> tuple[list[PendingDesign], list[PendingDesign]]:
    """(samples due at `cycle`, samples still waiting); with `flush` every sample is due (the
    reference trains everything still buffered at its last rollout)."""
    due = [d for d in pending if flush or d.due <= cycle]
    return due, [d for d in pending if not (flush or d.due <= cycle)]
