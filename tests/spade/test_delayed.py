"""Delayed Designer samples: the window collects the right plays, the reward uses all of them."""

import json

import numpy as np
import pytest

from spade_jax.spade import rewards
from spade_jax.spade.batch import TrainSample
from spade_jax.spade.delayed import PendingDesign, due_outcome, record_plays


def pending(status="ok", cycle=4, due=8, r_hint=0.75, env_id="c00004_s0_Logical_Deduction"):
    sample = TrainSample(np.arange(5, dtype=np.int32), np.array([0, 0, 1, 1, 1], bool),
                         np.array([0, 0, -1, -2, -3], np.float32), 0.0, "designer")
    return PendingDesign(due, cycle, sample, "Logical_Deduction", status, env_id, r_hint)


def test_window_holds_the_regen_cycle_and_the_delay_cycles_after_it():
    design, other = pending(), pending(env_id="someone_else")
    for cycle, returns in [(4, [0.0, 1.0]), (5, [1.0, 1.0]), (7, [1.0, 0.0]), (8, [1.0, 1.0])]:
        record_plays([design, other], cycle, {design.env_id: returns})
    # offsets 0, 1 and 3 are in the window; cycle 8 (the due cycle) is not
    assert design.window.by_offset == {0: [0.0, 1.0], 1: [1.0, 1.0], 3: [1.0, 0.0]}
    assert other.window.by_offset == {}
    outcome = due_outcome(design)
    # matched timing: r_hint 0.75 - mean(offset 0) 0.5; win rate: mean of all 6 plays
    assert outcome.regret == pytest.approx(0.25)
    assert outcome.win_rate == pytest.approx(4 / 6)
    window_mean = due_outcome(design, matched_timing=False)
    assert window_mean.regret == pytest.approx(0.75 - 4 / 6)
    # blend of the windowed outcome: 0.6 * plateau(0.667) + 0.4 * clip(0.25 / 0.15, 0, 1)
    assert rewards.raw_designer_reward(outcome, rewards.RewardVariant.BLEND) == pytest.approx(
        0.6 * (1 - (4 / 6 - 0.6) / 0.25) + 0.4 * 1.0)


def test_without_delay_the_window_is_the_regen_cycle_only():
    design = pending(cycle=2, due=2)
    record_plays([design], 2, {design.env_id: [0.0, 0.5]})
    record_plays([design], 3, {design.env_id: [1.0, 1.0]})
    assert design.window.by_offset == {0: [0.0, 0.5]}


def test_a_timed_out_sample_keeps_its_plays_and_an_invalid_one_has_none():
    invalid = pending("invalid")
    record_plays([invalid], 4, {invalid.env_id: [1.0]})
    assert invalid.window.by_offset == {}
    assert due_outcome(invalid) == rewards.DesignerOutcome("Logical_Deduction", "invalid")
    # blacklisted in its regen cycle: the plays it got there are its window, as the
    # reference's blend scores it from them (only `regret` gives the -0.5 penalty)
    timed_out = pending("step_timeout")
    record_plays([timed_out], 4, {timed_out.env_id: [1.0, 0.0]})
    assert due_outcome(timed_out) == rewards.DesignerOutcome(
        "Logical_Deduction", "step_timeout", regret=0.25, win_rate=0.5, n_plays=2)


def test_pending_design_survives_a_checkpoint_round_trip():
    design = pending()
    record_plays([design], 4, {design.env_id: [0.0, 1.0]})
    record_plays([design], 6, {design.env_id: [0.5]})
    copy = PendingDesign.from_json(json.loads(json.dumps(design.to_json())))
    assert copy.window.by_offset == design.window.by_offset
    assert (copy.due, copy.cycle, copy.skill, copy.status, copy.env_id, copy.r_hint) == (
        8, 4, "Logical_Deduction", "ok", design.env_id, 0.75)
    assert copy.sample.behaviour_logp.tolist() == design.sample.behaviour_logp.tolist()
