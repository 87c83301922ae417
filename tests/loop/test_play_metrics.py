"""The cycle's play metrics count the hint plays that were shown no hint, and why."""

from types import SimpleNamespace

import numpy as np
import pytest

from spade_jax.spade.designer import DesignedEnv
from spade_jax.spade.loop import EnvPlays, play_metrics
from spade_jax.spade.prompts import GameType
from spade_jax.spade.rewards import FailedPlays
from spade_jax.spade.rollout import Episode, EpisodeSpec


def episode(hint=None, hint_status=""):
    spec = EpisodeSpec("e", "class EEnv: pass", 0, hint="asked" if hint_status else None)
    return Episode(spec, np.zeros(3, np.int32), np.zeros(3, bool), np.zeros(3, np.float32),
                   rewards=[0.0], terminated=True, status="ok", turns=1, generated_tokens=2,
                   hint=hint, hint_status=hint_status)


def plays_of(nohint, hinted):
    return EnvPlays.scored(DesignedEnv("e", "Optimization", "class EEnv: pass", None, 0),
                           nohint, hinted)


def test_hint_plays_shown_no_hint_are_counted_by_reason():
    # two envs, K = 2
    plays = [plays_of([episode(), episode()], [episode("a", "ok"), episode(None, "leak")]),
             plays_of([episode(), episode()], [episode(None, "leak"), episode(None, "empty")])]
    out = play_metrics(plays, None, n_designer=0, n_agent=4)
    assert out["hints/shown_rate"] == 0.25
    assert out["hints/leaked"] == 2.0
    assert out["agent/generated_tokens"] == 16.0
    # no-hint plays never count against the rate
    clean = play_metrics([plays_of([episode()], [episode("a", "ok")])], None, 0, 1)
    assert clean["hints/shown_rate"] == 1.0 and clean["hints/leaked"] == 0.0


def test_play_pool_pairs_each_envs_plays_by_seed():
    """K no-hint plays of every env; K_hint hint plays only of the hinted ones, play i < K on
    no-hint play i's seed; every play sampled with the Agent's decoding."""

    from spade_jax.spade.loop import play_pool
    from spade_jax.spade.rewards import FailedPlays
    from spade_jax.spade.rollout import Decoding

    asked = []

    def play(specs, decoding, seed):  # an episode per spec that remembers what it was asked
        asked.append(decoding)
        return [Episode(s, np.zeros(1, np.int32), np.zeros(1, bool), np.zeros(1, np.float32),
                        [float(s.hint is not None)], True, "ok", 1, 1, hint=s.hint)
                for s in specs]

    envs = [DesignedEnv(f"env{i}", "Optimization", f"code{i}", None, 0, hint=f"h{i}")
            for i in range(2)]
    spade = SimpleNamespace(no_hint_plays=lambda n_envs: 3, hint_plays_per_env=5,
                            cut_reply_truncates=True, game_type=GameType.GAME,
                            failed_plays=FailedPlays.DROP)
    agent = Decoding(0.6, 0.95, 20, 8)
    plays = play_pool(SimpleNamespace(play=play), spade, agent, 0, 4, envs, {"env0"})
    assert asked == [agent]
    assert [p.env for p in plays] == envs
    hinted, plain = plays
    assert [e.spec.env_id for e in hinted.episodes] == ["env0"] * 8
    assert [e.spec.hint for e in hinted.nohint] == [None] * 3
    assert [e.spec.hint for e in hinted.hinted] == ["h0"] * 5
    # as the reference's arms: a cut reply ends a no-hint play, a game's hint play steps it,
    # a tool-use hint play (the reference's tool-call loop for both arms) ends too
    assert [e.spec.end_on_cut_reply for e in hinted.episodes] == [True] * 3 + [False] * 5
    tool_use = SimpleNamespace(**{**vars(spade), "game_type": GameType.TOOL_USE})
    (tool_hinted, _) = play_pool(SimpleNamespace(play=play), tool_use, agent, 0, 4, envs,
                                 {"env0"})
    assert [e.spec.end_on_cut_reply for e in tool_hinted.episodes] == [True] * 8
    assert [e.spec.seed for e in hinted.nohint] == [e.spec.seed for e in hinted.hinted][:3]
    assert len({e.spec.seed for e in hinted.hinted}) == 5
    assert hinted.stats.r_nohint == 0.0 and hinted.stats.r_hint == 1.0
    assert hinted.stats.n_hint == 5
    assert plain.hinted is None and [e.spec.hint for e in plain.episodes] == [None] * 3
    assert plain.stats.r_hint is None and plain.stats.regret is None and plain.stats.n_hint == 0

    # a hint call that wrote nothing: no hint plays, and the hint side's mean is 0 (the
    # reference's regret when hint generation fails), not the return of hintless plays
    envs[1].hint = ""
    (silent,) = play_pool(SimpleNamespace(play=play), spade, agent, 0, 4, envs[1:], {"env1"})
    assert silent.hinted == [] and len(silent.nohint) == 3
    assert silent.stats.r_hint == 0.0 and silent.stats.n_hint == 0
    assert play_metrics([silent, plain], None, 0, 6)["hints/none_written"] == 1.0


def test_hint_plays_that_dropped_their_hint_do_not_count_for_regret():
    """Only plays shown the hint make the hint side; none shown: mean 0, as a failed hint."""
    def scored(rewards_and_hints):
        hinted = [Episode(EpisodeSpec("e", "c", i, hint="h"), np.zeros(1, np.int32),
                          np.zeros(1, bool), np.zeros(1, np.float32), [r], True, "ok", 1, 1,
                          hint=shown, hint_status="ok" if shown else "leak")
                  for i, (r, shown) in enumerate(rewards_and_hints)]
        return plays_of([episode(), episode()], hinted).stats

    assert scored([(1.0, "h"), (0.5, None)]).r_hint == 1.0
    leaked = scored([(1.0, None), (1.0, None)])
    assert leaked.r_hint == 0.0 and leaked.regret == 0.0 and leaked.n_hint == 0


@pytest.mark.parametrize("failed_plays, r_hint", [
    (FailedPlays.DROP, 1 / 3),  # (1 + 0 + 0) / 3: the reference's hint arm counts them 0
    (FailedPlays.SCORE, -1 / 3),  # (1 - 1 - 1) / 3: scored -1 like any failed play
])
def test_a_failed_hint_play_counts_in_the_hint_mean(failed_plays, r_hint):
    def hint_play(status, shown):
        return Episode(EpisodeSpec("e", "c", 0, hint="h"), np.zeros(1, np.int32),
                       np.zeros(1, bool), np.zeros(1, np.float32), [1.0], True, status, 1, 1,
                       hint=shown)

    hinted = [hint_play("ok", "h"), hint_play("timeout", "h"), hint_play("crashed", None),
              hint_play("ok", None)]  # the last one's hint was dropped (our leak check)
    stats = EnvPlays.scored(DesignedEnv("e", "Optimization", "c", None, 0),
                            [episode(), episode()], hinted, failed_plays).stats
    assert stats.n_hint == 3 and stats.r_hint == pytest.approx(r_hint)


@pytest.mark.parametrize("replies, calls, hints", [
    ([["", "use the map"], [""], ["go north first"]], [2, 1, 1],
     ["go north first", "use the map"]),
    ([[""], [""], [""], ["never asked"]], [1, 1, 1], [""]),  # three calls at most
])
def test_an_empty_hint_reply_is_asked_again_up_to_three_calls(replies, calls, hints):
    """As the reference's SelfHintGenerator.generate_hint_with_retry."""
    from spade_jax.sampling import Completion
    from spade_jax.spade.hints import HintMode
    from spade_jax.spade.loop import write_hints

    answers, asked = iter(replies), []

    def generate(messages_list, decoding, seed):
        asked.append(len(messages_list))
        return [Completion(text, [], [], "stop") for text in next(answers)]

    envs = [DesignedEnv(f"env{i}", "Optimization", f"code{i}", None, 0) for i in range(len(hints))]
    write_hints(SimpleNamespace(generate=generate),
                SimpleNamespace(hint_mode=HintMode.SELF, game_type=GameType.GAME),
                SimpleNamespace(hint=None), envs, np.random.default_rng(0))
    assert asked == calls and [e.hint for e in envs] == hints
