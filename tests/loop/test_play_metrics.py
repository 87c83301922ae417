"""The cycle's play metrics count the hint plays that were shown no hint, and why."""

import numpy as np

from spade_jax.spade.loop import play_metrics
from spade_jax.spade.rollout import Episode, EpisodeSpec


def episode(hint=None, hint_status=""):
    spec = EpisodeSpec("e", "class EEnv: pass", 0, hint="asked" if hint_status else None)
    return Episode(spec, np.zeros(3, np.int32), np.zeros(3, bool), np.zeros(3, np.float32),
                   rewards=[0.0], terminated=True, status="ok", turns=1, generated_tokens=2,
                   hint=hint, hint_status=hint_status)


def test_hint_plays_shown_no_hint_are_counted_by_reason():
    # two envs, K = 2: [no-hint, no-hint, hint, hint] each
    plays = [[episode(), episode(), episode("a", "ok"), episode(None, "leak")],
             [episode(), episode(), episode(None, "leak"), episode(None, "empty")]]
    out = play_metrics([], plays, None, n_designer=0, n_agent=4)
    assert out["hints/shown_rate"] == 0.25
    assert out["hints/leaked"] == 2.0
    assert out["agent/generated_tokens"] == 16.0
    # no-hint plays never count against the rate
    clean = play_metrics([], [[episode(), episode("a", "ok")]], None, 0, 1)
    assert clean["hints/shown_rate"] == 1.0 and clean["hints/leaked"] == 0.0
