"""Golden values for the Agent return and the Designer reward variants (reference formulas)."""

import dataclasses
import math

import numpy as np
import pytest

from spade_jax.spade import rewards as R


@pytest.mark.parametrize(
    ("step_rewards", "terminated", "failed", "expected"),
    [
        ([0.0, 0.5, 1.0], True, False, 1.0),
        ([0.0, 3.0], True, False, 1.0),  # clipped to 1
        ([-2.0], True, False, -1.0),  # clipped to -1
        ([0.3], True, False, 0.3),
        ([0.5, 0.5], False, False, 0.0),  # truncated: partial credit earns nothing
        ([], True, False, 0.0),
        ([1.0], True, True, -1.0),  # crashed / timed out
    ],
)
def test_episode_return(step_rewards, terminated, failed, expected):
    assert R.episode_return(step_rewards, terminated, failed=failed) == pytest.approx(expected)


def test_episode_return_rejects_nan():
    with pytest.raises(ValueError, match="not finite"):
        R.episode_return([math.nan], True)


@pytest.mark.parametrize(
    ("win", "expected"),
    [(0.0, 0.0), (0.15, 0.0), (0.4, 1.0), (0.5, 1.0), (0.6, 1.0), (0.85, 0.0), (1.0, 0.0),
     (0.275, 0.5), (0.725, 0.5)],
)
def test_plateau(win, expected):
    assert R.plateau(win) == pytest.approx(expected)


def test_regret_variant_floors_at_zero():
    assert R.regret_reward(-0.2) == 0.0
    assert R.regret_reward(0.25) == 0.25


def test_blend_golden():
    assert R.blend_reward(0.3, 0.5) == pytest.approx(0.6 * 1 + 0.4 * 1)  # = 1.0
    assert R.blend_reward(0.06, 0.3) == pytest.approx(0.6 * 0.6 + 0.4 * 0.4)  # 0.52
    assert R.blend_reward(-0.1, 0.5) == pytest.approx(0.6)  # regret part floored
    assert R.blend_reward(-0.3, 0.0, regret_floor=False) == pytest.approx(-0.8)


def test_solve_rate_is_plateau_only():
    assert R.solve_rate_reward(0.5) == 1.0
    assert R.solve_rate_reward(0.95) == 0.0


def test_role_scale():
    assert R.role_scale(192, 24, 4) == 32.0  # 192/24*4
    assert R.role_scale(192, 12, 4) == 50.0  # 64 capped at 50
    assert R.role_scale(0, 24, 4) == 1.0
    assert R.role_scale(8, 8, 1) == 1.0


def test_center_per_skill_by_hand():
    centred = R.center_per_skill([0.2, 0.4, 0.9], ["A", "A", "B"])
    np.testing.assert_allclose(centred, [-0.1, 0.1, 0.0])
    masked = R.center_per_skill([0.2, 0.4, 5.0, 0.9], ["A", "A", "A", "B"],
                                [True, True, False, True])
    np.testing.assert_allclose(masked, [-0.1, 0.1, 0.0, 0.0])


def test_designer_rewards_regret_variant_with_penalties():
    outcomes = [
        R.DesignerOutcome("A", regret=0.5),
        R.DesignerOutcome("A", regret=-0.2),  # floored to 0
        R.DesignerOutcome("A", status="step_timeout", regret=0.9),  # -0.5
        R.DesignerOutcome("B", regret=0.3),
        R.DesignerOutcome("B", status="invalid"),  # -1 when penalised
    ]
    result = R.designer_rewards(outcomes, R.RewardVariant.REGRET, scale=2.0)
    np.testing.assert_allclose(result.raw, [0.5, 0.0, -0.5, 0.3, -1.0])
    assert result.trained.all()
    # skill A mean 0; skill B mean -0.35
    np.testing.assert_allclose(result.advantages, [1.0, 0.0, -1.0, 1.3, -1.3])

    parity = R.designer_rewards(outcomes, R.RewardVariant.REGRET, scale=2.0,
                                penalize_invalid=False)
    assert parity.trained.tolist() == [True, True, True, True, False]
    np.testing.assert_allclose(parity.advantages, [1.0, 0.0, -1.0, 0.0, 0.0])


def test_only_the_regret_variant_penalises_a_step_timeout():
    # the reference: recompute_delayed_env_rewards_regret gives -0.5; blend, solve rate and
    # learning potential score the timed-out environment from its plays
    timed_out = R.DesignerOutcome("A", status="step_timeout", regret=0.3, win_rate=0.5,
                                  n_plays=4)
    played = dataclasses.replace(timed_out, status="ok")
    assert R.raw_designer_reward(timed_out, R.RewardVariant.REGRET) == -0.5
    trackers = {"A": R.LearningPotentialState()}
    for variant in (R.RewardVariant.BLEND, R.RewardVariant.SOLVE_RATE,
                    R.RewardVariant.LEARNING_POTENTIAL):
        assert R.raw_designer_reward(timed_out, variant, learning_potentials=trackers) == \
            R.raw_designer_reward(played, variant, learning_potentials=trackers) > 0
    # and blend masks a timed-out sample scored negative, as any played one
    unfloored = R.BlendParams(regret_floor=False)
    negative = dataclasses.replace(timed_out, regret=-0.3, win_rate=0.0)
    result = R.designer_rewards([negative, played], R.RewardVariant.BLEND, 1.0, blend=unfloored)
    assert result.raw[0] < 0 and result.trained.tolist() == [False, True]


def test_designer_rewards_blend_and_mask():
    outcomes = [
        R.DesignerOutcome("A", regret=0.3, win_rate=0.5),  # 1.0
        R.DesignerOutcome("A", regret=0.0, win_rate=1.0),  # 0.0
        R.DesignerOutcome("A", regret=-0.3, win_rate=0.0),  # -0.8 unfloored
    ]
    floored = R.designer_rewards(outcomes, R.RewardVariant.BLEND, scale=1.0)
    np.testing.assert_allclose(floored.raw, [1.0, 0.0, 0.0])
    assert floored.trained.all()
    unfloored = R.designer_rewards(outcomes, R.RewardVariant.BLEND, scale=1.0,
                                    blend=R.BlendParams(regret_floor=False))
    np.testing.assert_allclose(unfloored.raw, [1.4, 0.0, -0.8])  # 0.6 + 0.4 * 0.3/0.15
    assert unfloored.trained.tolist() == [True, True, False]
    np.testing.assert_allclose(unfloored.advantages, [0.7, -0.7, 0.0])


def test_solve_rate_variant():
    outcomes = [R.DesignerOutcome("A", win_rate=0.5), R.DesignerOutcome("A", win_rate=0.95)]
    result = R.designer_rewards(outcomes, R.RewardVariant.SOLVE_RATE, scale=10.0)
    np.testing.assert_allclose(result.raw, [1.0, 0.0])
    np.testing.assert_allclose(result.advantages, [5.0, -5.0])


def test_learning_potential_tracker_golden():
    state = R.LearningPotentialState()  # gamma (0.98, 0.85)
    assert state.baseline == 0.0
    state = R.update_learning_potential(state, 0.5)
    assert (state.mu_fast, state.mu_slow) == (0.5, 0.5)
    state = R.update_learning_potential(state, 1.0)
    assert state.mu_fast == pytest.approx(0.02 * 0.5 + 0.98 * 1.0)  # 0.99
    assert state.mu_slow == pytest.approx(0.15 * 0.5 + 0.85 * 1.0)  # 0.925
    assert R.learning_potential_reward(0.5, state) == pytest.approx(0.425)
    assert R.LearningPotentialState.from_dict(state.to_dict()) == state


def test_learning_potential_variant_needs_tracker():
    outcomes = [R.DesignerOutcome("A", win_rate=0.5, n_plays=4),
                R.DesignerOutcome("A", win_rate=1.0, n_plays=2),
                R.DesignerOutcome("A")]  # every play failed: raw 0 (reference), not |0 - 0.7|
    trackers = {"A": R.LearningPotentialState(mu_fast=0.8, mu_slow=0.7)}
    result = R.designer_rewards(outcomes, R.RewardVariant.LEARNING_POTENTIAL, 1.0,
                                learning_potentials=trackers)
    np.testing.assert_allclose(result.raw, [0.2, 0.3, 0.0])
    with pytest.raises(ValueError, match="tracker for skill 'A'"):
        R.designer_rewards(outcomes, R.RewardVariant.LEARNING_POTENTIAL, 1.0)


def test_bad_inputs_fail_clearly():
    with pytest.raises(ValueError, match="gamma_fast > gamma_slow"):
        R.LearningPotentialState(gamma_fast=0.5, gamma_slow=0.9)
    with pytest.raises(ValueError, match="status"):
        R.DesignerOutcome("A", status="crashed")


def tracker_outcomes():
    """Skill A: two played samples (6 and 2 plays), one with no counted play, one invalid;
    skill B: one played sample."""
    return [R.DesignerOutcome("A", win_rate=1.0, n_plays=6),
            R.DesignerOutcome("A", win_rate=0.0, n_plays=2),
            R.DesignerOutcome("A", win_rate=0.5, n_plays=0),
            R.DesignerOutcome("A", R.DesignerStatus.INVALID, win_rate=0.9, n_plays=4),
            R.DesignerOutcome("B", win_rate=0.25, n_plays=3)]


def test_only_learning_potential_adds_a_fresh_tracker_per_new_skill():
    kept = R.LearningPotentialState(mu_fast=0.1, mu_slow=0.2)
    lp = R.RewardVariant.LEARNING_POTENTIAL.trackers_for(tracker_outcomes(), {"A": kept})
    assert lp == {"A": kept, "B": R.LearningPotentialState()}
    for variant in (R.RewardVariant.BLEND, R.RewardVariant.REGRET, R.RewardVariant.SOLVE_RATE):
        assert variant.trackers_for(tracker_outcomes(), {"A": kept}) == {"A": kept}


@pytest.mark.parametrize("pooled, mean_a", [
    (True, 0.75),  # (6 x 1.0 + 2 x 0.0) / 8: plays pooled, an uncounted or invalid one left out
    (False, 0.5),  # mean of the played samples' win rates (1.0, 0.0, 0.5), invalid left out
])
def test_each_played_skill_advances_its_tracker_once(pooled, mean_a):
    variant = R.RewardVariant.LEARNING_POTENTIAL
    fresh = variant.trackers_for(tracker_outcomes(), {})
    out = variant.advance_trackers(tracker_outcomes(), fresh, pooled=pooled)
    # a fresh tracker is initialised to the first mean, both speeds
    assert (out["A"].mu_fast, out["A"].mu_slow) == (pytest.approx(mean_a),
                                                    pytest.approx(mean_a))
    assert out["B"].mu_slow == pytest.approx(0.25)
    moved = variant.advance_trackers(tracker_outcomes(), {"A": R.LearningPotentialState(
        mu_fast=0.0, mu_slow=0.0), "B": out["B"]}, pooled=pooled)
    assert moved["A"].mu_fast == pytest.approx(0.98 * mean_a)  # one EMA step, gamma_fast 0.98
    assert fresh["A"] == R.LearningPotentialState()  # inputs are not mutated


def test_variants_without_trackers_leave_them_unchanged():
    trackers = {"A": R.LearningPotentialState(mu_fast=0.1, mu_slow=0.2)}
    assert R.RewardVariant.BLEND.advance_trackers(tracker_outcomes(), trackers,
                                                  pooled=True) == trackers
