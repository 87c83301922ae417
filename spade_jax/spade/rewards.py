"""Returns and Designer rewards of SPADE, as pure functions (docs/DESIGN.md §4.6).

The mathematics reproduces the reference (`spade-rl/spade`: `spade/core/utils/rewards.py`,
`spade/core/utils/delayed_env_rewards.py`, `spade/core/learning_potential.py`):

* the Agent's episode return is outcome-only: ``clip(last_reward, -1, 1)`` if the episode
  terminated, else 0; a crashed or timed-out episode is dropped (reference) or scores -1
  (`FailedPlays`);
* a Designer sample gets a *raw* reward from one of four variants (``regret``, ``blend``,
  ``solve_rate``, ``learning_potential``; blend's weights, band, ramp and regret scale are
  `BlendParams`), or a fixed penalty (step timeout -0.5, invalid generation -1 when
  ``penalize_invalid``; the reference never trains an invalid design);
* raw rewards are centred per skill (mean only, no std: a small-batch std blows rewards up)
  and multiplied by the role scale ``s = min(N_agent / N_designer * regen_interval, 50)``,
  which compensates for Designer samples being rare.
"""

from __future__ import annotations

import dataclasses
import enum
import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

STEP_TIMEOUT_PENALTY = -0.5
INVALID_GENERATION_PENALTY = -1.0
FAILED_EPISODE_RETURN = -1.0
STEP_ERROR_REWARD = -1.0  # reference SyntheticGameEnv.step's reward for a step that raises


class FailedPlays(enum.StrEnum):
    """What a crashed or timed-out play counts for: DROP (reference ``play_games_async``: it is
    left out of the Agent's normalisation, its training and the environment's statistics) or
    SCORE (it scores `FAILED_EPISODE_RETURN` and is trained like any play)."""

    DROP = "drop"
    SCORE = "score"

    def kept(self, episodes: Sequence[Any]) -> list[Any]:
        """The plays (objects with ``.failed``) that count under this mode."""
        return [e for e in episodes if not (self is FailedPlays.DROP and e.failed)]

    def hint_return(self, episode: Any) -> float:
        """What a hint play (with ``.failed``, ``.episode_return``) counts for: under DROP a
        failed one counts 0, as the reference's hint arm returns 0 for a play whose game
        failed to load or hung; under SCORE it scores like any failed play."""
        return 0.0 if self is FailedPlays.DROP and episode.failed else episode.episode_return


class StepErrors(enum.StrEnum):
    """What a step of a played environment that raises (or breaks the contract) does: LOSE
    (reference ``SyntheticGameEnv.step``: it answers ``("Error: ...", -1.0, terminated)``, so
    the play ends as a loss and is trained like any) or FAIL (the play failed, and
    `FailedPlays` decides what it counts for). A timeout always fails the play."""

    LOSE = "lose"
    FAIL = "fail"

    @property
    def reward(self) -> float | None:
        """The reward that ends a play at a step error (None: the play fails)."""
        return STEP_ERROR_REWARD if self is StepErrors.LOSE else None


class LPUpdate(enum.StrEnum):
    """When the ``learning_potential`` trackers advance in a cycle that scores Designer samples.

    BEFORE_SCORING (reference, delayed mode): each skill's tracker first takes the mean of all
    pooled window plays of that skill, then the samples are scored against it.
    AFTER_SCORING: samples are scored against the previous tracker, which then takes the mean
    of the skill's per-environment win rates.
    """

    BEFORE_SCORING = "before_scoring"
    AFTER_SCORING = "after_scoring"


class RoleScaleCounts(enum.StrEnum):
    """What `role_scale` counts. VALID (reference ``compute_env_reward_scale`` call): Designer
    samples of valid environments and Agent samples of designed environments (not memory
    replays). TRAINED: every trained Designer sample and every Agent sample."""

    VALID = "valid"
    TRAINED = "trained"

    def agent_count(self, trained: int, designed: int) -> int:
        """The Agent samples counted: all `trained`, or the `designed` among them (those of
        designed environments, memory replays left out)."""
        return trained if self is RoleScaleCounts.TRAINED else designed

    def designer_statuses(self, penalize_invalid: bool) -> tuple[DesignerStatus, ...]:
        """The due Designer samples counted, by status: those of valid designs, and under
        TRAINED the invalid ones too when they are trained (`penalize_invalid`)."""
        statuses = (DesignerStatus.OK, DesignerStatus.STEP_TIMEOUT)
        if self is RoleScaleCounts.TRAINED and penalize_invalid:
            statuses += (DesignerStatus.INVALID,)
        return statuses


class DesignerStatus(enum.StrEnum):
    """Fate of one Designer sample: played, blacklisted for a step timeout, or invalid."""

    OK = "ok"
    STEP_TIMEOUT = "step_timeout"
    INVALID = "invalid"


class RewardVariant(enum.StrEnum):
    """How a played Designer sample is scored (docs/DESIGN.md §4.6), and what the variant
    keeps across cycles (only ``learning_potential`` keeps per-skill plateau trackers)."""

    REGRET = "regret"
    BLEND = "blend"
    SOLVE_RATE = "solve_rate"
    LEARNING_POTENTIAL = "learning_potential"

    def penalty(self, status: DesignerStatus) -> float | None:
        """The fixed raw reward of a failed sample, or None when the variant scores it from
        its plays. An invalid design always gets its penalty; a step timeout only under
        ``regret``: the reference's blend, solve-rate and learning-potential rewards score a
        timed-out environment from the plays it got, like any other."""
        if status is DesignerStatus.INVALID:
            return INVALID_GENERATION_PENALTY
        if status is DesignerStatus.STEP_TIMEOUT and self is RewardVariant.REGRET:
            return STEP_TIMEOUT_PENALTY
        return None

    def score(self, outcome: DesignerOutcome,
              learning_potentials: Mapping[str, LearningPotentialState] | None,
              blend: BlendParams) -> float:
        """Raw reward of a sample scored from its plays (no `penalty`)."""
        if self is RewardVariant.REGRET:
            return regret_reward(outcome.regret)
        if self is RewardVariant.BLEND:
            return blend.reward(outcome.regret, outcome.win_rate)
        if self is RewardVariant.SOLVE_RATE:
            return solve_rate_reward(outcome.win_rate, blend)
        if learning_potentials is None or outcome.skill not in learning_potentials:
            raise ValueError(
                f"variant 'learning_potential' needs a tracker for skill {outcome.skill!r}")
        if outcome.n_plays == 0:  # no play counted: raw 0, as the reference
            return 0.0
        return learning_potential_reward(outcome.win_rate, learning_potentials[outcome.skill])

    @property
    def needs_hints(self) -> bool:
        """Whether the variant reads regret, so that hints are written and hint plays run
        (the reference computes hints for ``regret`` and ``blend`` only)."""
        return self in (RewardVariant.REGRET, RewardVariant.BLEND)

    def trains_negative(self) -> bool:
        """False for ``blend``: a played sample with a negative raw reward is not trained
        (reference mask against the difficulty-easing death spiral)."""
        return self is not RewardVariant.BLEND

    def trackers_for(self, outcomes: Sequence[DesignerOutcome],
                     trackers: Mapping[str, LearningPotentialState]
                     ) -> dict[str, LearningPotentialState]:
        """``trackers`` plus a fresh one for every skill in ``outcomes`` this variant scores
        with a tracker (unchanged for the variants that keep none)."""
        out = dict(trackers)
        if self is RewardVariant.LEARNING_POTENTIAL:
            for o in outcomes:
                out.setdefault(o.skill, LearningPotentialState())
        return out

    def advance_trackers(self, outcomes: Sequence[DesignerOutcome],
                         trackers: Mapping[str, LearningPotentialState], *, pooled: bool
                         ) -> dict[str, LearningPotentialState]:
        """Each played skill's tracker advanced once (unchanged for the other variants).

        ``pooled`` (reference delayed mode): with the mean of all the skill's window plays,
        i.e. win rates weighted by their play counts; else with the mean of its win rates.
        """
        out = dict(trackers)
        if self is not RewardVariant.LEARNING_POTENTIAL:
            return out
        played = [o for o in outcomes if self.penalty(o.status) is None
                  and (o.n_plays > 0 or not pooled)]
        for skill in dict.fromkeys(o.skill for o in played):
            mine = [o for o in played if o.skill == skill]
            weights = [o.n_plays for o in mine] if pooled else None
            mean = float(np.average([o.win_rate for o in mine], weights=weights))
            out[skill] = update_learning_potential(out[skill], mean)
        return out



def episode_return(rewards: Sequence[float], terminated: bool, failed: bool = False) -> float:
    """Agent return of one episode: outcome-only, in [-1, 1].

    ``clip(rewards[-1], -1, 1)`` if the episode terminated, 0 if it was truncated or produced
    no reward, and -1 if it ``failed`` (crashed or timed out in the sandbox), matching the
    reference's ``episode_reward`` and its FAILED-trajectory score. Intermediate rewards are
    ignored on purpose so that partial-credit farming earns nothing.
    """
    if failed:
        return FAILED_EPISODE_RETURN
    if not terminated or len(rewards) == 0:
        return 0.0
    last = float(rewards[-1])
    if not math.isfinite(last):
        raise ValueError(f"episode's last reward is not finite: {last!r}")
    return min(1.0, max(-1.0, last))


def plateau(win_rate: float, lo: float = 0.4, hi: float = 0.6, ramp: float = 0.25) -> float:
    """Flat-top difficulty reward: 1 on [lo, hi], falling linearly to 0 over ``ramp``.

    Pays environments the Agent wins about half of the time; trivial (win 1) and impossible
    (win 0) environments earn 0. Reference ``plateau_reward``.
    """
    if win_rate < lo:
        return max(0.0, 1.0 - (lo - win_rate) / ramp)
    if win_rate > hi:
        return max(0.0, 1.0 - (win_rate - hi) / ramp)
    return 1.0


def regret_reward(regret: float) -> float:
    """Variant ``regret`` (paper headline): ``max(0, regret)``.

    Negative hint regret is noise (the hint cannot make the task harder on average), so it is
    floored rather than dropped.
    """
    return max(0.0, float(regret))


def blend_reward(
    regret: float,
    win_rate: float,
    *,
    plateau_weight: float = 0.6,
    regret_weight: float = 0.4,
    regret_scale: float = 0.15,
    regret_floor: bool = True,
    plateau_lo: float = 0.4,
    plateau_hi: float = 0.6,
    plateau_ramp: float = 0.25,
) -> float:
    """Variant ``blend`` (released default): ``0.6*plateau(win) + 0.4*clip(regret/0.15, 0, 1)``
    with the plateau band [0.4, 0.6] and ramp 0.25 (reference ``recompute_delayed_env_rewards
    _blend``; every constant is a parameter, `BlendParams` in a run).

    The plateau term selects the difficulty band, the normalised regret term ranks the in-band
    environments by how much the hint helps. ``regret_scale`` 0.15 is about the standard error
    of the regret at K=8 binary plays. With ``regret_floor=False`` the normalised regret is not
    clipped and the blend can go negative (such samples are masked, see `designer_rewards`).
    ``win_rate`` is the mean return over the window, as in the reference.
    """
    normalised_regret = float(regret) / regret_scale
    if regret_floor:
        normalised_regret = min(1.0, max(0.0, normalised_regret))
    return (plateau_weight * plateau(win_rate, plateau_lo, plateau_hi, plateau_ramp)
            + regret_weight * normalised_regret)


@dataclasses.dataclass(frozen=True)
class BlendParams:
    """The blend reward's constants (config ``spade.blend``); the defaults are the reference
    games recipes' (`cmd/games/train_spade_30b.sh`); its 4B second phase uses the band
    [0.2, 0.4] with ramp 0.2."""

    plateau_weight: float = 0.6
    regret_weight: float = 0.4
    regret_scale: float = 0.15
    regret_floor: bool = True
    plateau_lo: float = 0.4
    plateau_hi: float = 0.6
    plateau_ramp: float = 0.25

    def reward(self, regret: float, win_rate: float) -> float:
        """`blend_reward` with these constants."""
        return blend_reward(regret, win_rate, **dataclasses.asdict(self))

    def plateau(self, win_rate: float) -> float:
        """`plateau` with this band and ramp."""
        return plateau(win_rate, self.plateau_lo, self.plateau_hi, self.plateau_ramp)

    def problems(self) -> list[str]:
        out = []
        if not 0.0 <= self.plateau_lo <= self.plateau_hi <= 1.0:
            out.append(f"plateau_lo={self.plateau_lo}, plateau_hi={self.plateau_hi}: need "
                       "0 <= plateau_lo <= plateau_hi <= 1")
        for key in ("plateau_ramp", "regret_scale"):
            if getattr(self, key) <= 0:
                out.append(f"{key}={getattr(self, key)} must be > 0")
        return out


def solve_rate_reward(win_rate: float, blend: BlendParams = BlendParams()) -> float:
    """Variant ``solve_rate`` (ablation): the plateau term alone, with the blend's band."""
    return blend.plateau(win_rate)


@dataclasses.dataclass(frozen=True)
class LearningPotentialState:
    """EMA tracker of one skill's mean Agent return (reference ``LearningPotential``).

    ``mu_fast`` / ``mu_slow`` are ``None`` until the first update. Immutable and JSON-friendly
    (`to_dict` / `from_dict`) so that it is checkpointed with the host data.
    """

    gamma_fast: float = 0.98
    gamma_slow: float = 0.85
    mu_fast: float | None = None
    mu_slow: float | None = None

    def __post_init__(self) -> None:
        if not self.gamma_fast > self.gamma_slow:
            raise ValueError(
                f"learning potential needs gamma_fast > gamma_slow, got "
                f"{self.gamma_fast} <= {self.gamma_slow}"
            )

    @property
    def baseline(self) -> float:
        """The slow EMA, the baseline of the ``learning_potential`` variant (0 before data)."""
        return 0.0 if self.mu_slow is None else self.mu_slow

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> LearningPotentialState:
        return cls(**dict(data))


def update_learning_potential(
    state: LearningPotentialState, mean_return: float
) -> LearningPotentialState:
    """One EMA step: ``mu <- (1 - gamma) * mu + gamma * r`` for both trackers.

    The first observation initialises both means to ``r`` (reference behaviour). Note that in
    the reference's parametrisation gamma weighs the *new* value.
    """
    r = float(mean_return)
    if state.mu_fast is None or state.mu_slow is None:
        return dataclasses.replace(state, mu_fast=r, mu_slow=r)
    return dataclasses.replace(
        state,
        mu_fast=(1.0 - state.gamma_fast) * state.mu_fast + state.gamma_fast * r,
        mu_slow=(1.0 - state.gamma_slow) * state.mu_slow + state.gamma_slow * r,
    )


def learning_potential_reward(mean_return: float, state: LearningPotentialState) -> float:
    """Variant ``learning_potential``: ``|mean return of the env - mu_slow of its skill|``."""
    return abs(float(mean_return) - state.baseline)


@dataclasses.dataclass(frozen=True)
class DesignerOutcome:
    """What the Designer reward needs to know about one Designer sample.

    ``status`` is ``ok`` (validated and played), ``step_timeout`` (an env call timed out in
    its regen cycle's plays; the env is blacklisted) or ``invalid`` (the generation failed
    validation). ``win_rate`` is the mean Agent return over the window (plateau input), over
    ``n_plays`` plays; ``regret`` is unfloored; a timed-out sample has them too, from the plays
    it got (`RewardVariant.penalty` says which variants use them).
    """

    skill: str
    status: DesignerStatus = DesignerStatus.OK
    regret: float = 0.0
    win_rate: float = 0.0
    n_plays: int = 0

    def __post_init__(self) -> None:
        if self.status not in tuple(DesignerStatus):
            raise ValueError(
                f"designer outcome status {self.status!r} is not one of {tuple(DesignerStatus)}"
            )
        object.__setattr__(self, "status", DesignerStatus(self.status))


@dataclasses.dataclass(frozen=True)
class DesignerRewards:
    """Per-sample raw reward, whether the sample is trained, and its advantage."""

    raw: np.ndarray
    trained: np.ndarray
    advantages: np.ndarray


def raw_designer_reward(
    outcome: DesignerOutcome,
    variant: RewardVariant,
    *,
    learning_potentials: Mapping[str, LearningPotentialState] | None = None,
    blend: BlendParams = BlendParams(),
) -> float:
    """Raw reward of one Designer sample: the variant's penalty for a failure, else the
    variant's value (``blend`` and ``solve_rate`` with the constants of ``blend``)."""
    penalty = variant.penalty(outcome.status)
    if penalty is not None:
        return penalty
    return variant.score(outcome, learning_potentials, blend)


def role_scale(
    n_agent_samples: int, n_designer_samples: int, regen_interval: int, max_scale: float = 50.0
) -> float:
    """Designer advantage scale ``min(N_agent / N_designer * regen_interval, max_scale)``.

    Designer samples are few (one per environment, once every ``regen_interval`` cycles); the
    scale keeps their gradient comparable to the Agent's. 1.0 when either count is zero
    (reference ``compute_env_reward_scale``).
    """
    if n_agent_samples <= 0 or n_designer_samples <= 0:
        return 1.0
    return min(n_agent_samples / n_designer_samples * regen_interval, max_scale)


def center_per_skill(
    raw: Sequence[float], skills: Sequence[str], trained: Sequence[bool] | None = None
) -> np.ndarray:
    """``raw - mean(raw of the trained samples of the same skill)``; 0 for untrained samples.

    Mean-only centring (no std) as in the reference's ``_apply_centered_rewards``.
    """
    values = np.asarray(raw, dtype=np.float64)
    if len(skills) != len(values):
        raise ValueError(f"{len(values)} raw rewards but {len(skills)} skills")
    mask = np.ones(len(values), bool) if trained is None else np.asarray(trained, dtype=bool)
    centred = np.zeros_like(values)
    skill_array = np.asarray(skills, dtype=object)
    for skill in dict.fromkeys(skills):
        members = (skill_array == skill) & mask
        if members.any():
            centred[members] = values[members] - values[members].mean()
    return centred


def designer_rewards(
    outcomes: Sequence[DesignerOutcome],
    variant: RewardVariant,
    scale: float,
    *,
    penalize_invalid: bool = True,
    learning_potentials: Mapping[str, LearningPotentialState] | None = None,
    blend: BlendParams = BlendParams(),
) -> DesignerRewards:
    """Raw rewards, training mask and advantages ``(raw - skill mean) * scale`` of a batch.

    A sample is not trained when it is ``invalid`` and ``penalize_invalid`` is off (the
    reference retries silently and emits no sample), or, for ``blend``, when the raw reward
    it was scored with from its plays is negative, which needs ``blend.regret_floor=False``
    (reference mask against the difficulty-easing death spiral: a negative sample centred
    back up would get a positive advantage). Penalties (`RewardVariant.penalty`) are kept and
    centred with their skill.
    """
    raw = np.array(
        [
            raw_designer_reward(o, variant, learning_potentials=learning_potentials, blend=blend)
            for o in outcomes
        ],
        dtype=np.float64,
    )
    trained = np.ones(len(outcomes), dtype=bool)
    for index, outcome in enumerate(outcomes):
        if outcome.status == DesignerStatus.INVALID and not penalize_invalid:
            trained[index] = False
        if (not variant.trains_negative() and variant.penalty(outcome.status) is None
                and raw[index] < 0):
            trained[index] = False
    advantages = center_per_skill(raw, [o.skill for o in outcomes], trained) * scale
    return DesignerRewards(raw=raw, trained=trained, advantages=advantages)
