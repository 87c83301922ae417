"""Golden values for regret, its paired standard error, win rates and delay-window helpers."""

import math

import pytest

from spade_jax.spade import regret as G
from spade_jax.spade import rewards as R


def test_regret_and_paired_standard_error():
    hint, nohint = [1, 1, 0, 1], [0, 1, 0, 0]
    assert G.play_stats("e", "Optimization", nohint, hint).regret == pytest.approx(0.5)
    # differences [1, 0, 0, 1]: sample std sqrt(1/3), SE = sqrt(1/3) / 2
    assert G.regret_standard_error(hint, nohint) == pytest.approx(math.sqrt(1 / 3) / 2)


def test_unpaired_standard_error_and_single_play():
    # var([1, 0]) = 0.5, var([0, 0, 1]) = 1/3 (ddof=1)
    assert G.regret_standard_error([1, 0], [0, 0, 1]) == pytest.approx(
        math.sqrt(0.5 / 2 + (1 / 3) / 3)
    )
    assert math.isnan(G.regret_standard_error([1], [0]))


def test_win_rate_counts_positive_returns():
    assert G.play_stats("e", "Optimization", [1, 0, -1, 0.5], None).win_rate == 0.5


def test_play_stats():
    stats = G.play_stats("env0", "Optimization", [0, 1, 0, 0], [1, 1, 0, 1], n_failed=1)
    assert stats.r_hint == 0.75 and stats.r_nohint == 0.25
    assert stats.regret == pytest.approx(0.5)
    assert stats.win_rate == 0.25 and stats.mean_return == 0.25
    assert (stats.n_hint, stats.n_nohint, stats.n_failed) == (4, 4, 1)
    assert stats.to_dict()["env_id"] == "env0"
    empty = G.play_stats("env1", "Optimization", [], [1])  # every no-hint play dropped
    assert (empty.r_nohint, empty.regret, empty.n_nohint) == (0.0, 1.0, 0)
    unhinted = G.play_stats("env2", "Optimization", [1, 0], None)  # no hint plays this cycle
    assert unhinted.r_hint is None and unhinted.regret is None and unhinted.n_hint == 0


def test_window_matched_timing_vs_accumulated():
    """An improving Agent: accumulated no-hint plays drag regret down (reference bias)."""
    window = G.WindowReturns()
    window.add(0, [0, 0, 1, 0])
    window.add(1, [1, 1, 0, 1])
    window.add(2, [1, 1, 1, 1])
    assert G.window_regret(0.75, window) == pytest.approx(0.5)
    assert G.window_regret(0.75, window, matched_timing=False) == pytest.approx(0.75 - 8 / 12)
    win = G.window_mean_return(window)
    assert win == pytest.approx(8 / 12)
    # blend at delayed-training time: plateau(2/3) = 1 - (2/3 - 0.6)/0.25
    assert R.blend_reward(G.window_regret(0.75, window), win) == pytest.approx(
        0.6 * (1 - (2 / 3 - 0.6) / 0.25) + 0.4
    )


def test_empty_window_counts_as_zero():
    window = G.WindowReturns()
    assert G.window_regret(0.5, window) == 0.5
    assert G.window_mean_return(window) == 0.0
    with pytest.raises(ValueError, match="offset"):
        window.add(-1, [1.0])


