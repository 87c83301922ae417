"""Reference-parity semantics (docs/reference_parity.md): each default is the reference's, and
each option does what its table row says, checked against hand-computed reference values."""

import dataclasses
from types import SimpleNamespace

import numpy as np
import pytest

from spade_jax.config import load_config_file, parse
from spade_jax.defaults import base_config
from spade_jax.errors import ConfigError
from spade_jax.spade import rewards as R
from spade_jax.spade.batch import Role, TrainSample
from spade_jax.spade.delayed import PendingDesign, split_due
from spade_jax.spade.designer import DesignedEnv
from spade_jax.spade.hints import HintSchedule
from spade_jax.spade.loop import EnvPlays, designer_samples_for
from spade_jax.spade.regret import WindowReturns
from spade_jax.spade.rollout import Decoding, Episode, EpisodeSpec

# key path -> the reference's value (docs/reference_parity.md cites the file of each)
REFERENCE_DEFAULTS = {
    "sampling.designer_temperature": 0.6, "sampling.designer_top_p": 0.95,
    "sampling.designer_top_k": 20, "sampling.designer_max_new_tokens": 16384,
    "sampling.agent_temperature": 0.6, "sampling.agent_top_p": 0.95,
    "sampling.agent_top_k": 20, "sampling.agent_max_new_tokens": 8192,
    "sampling.hint_temperature": 0.3, "sampling.hint_top_p": 0.9, "sampling.hint_top_k": 0,
    "sampling.hint_max_new_tokens": 4096, "sampling.max_context": 32768,
    # spade/core/types.py env_validator_temperature / _max_tokens, through the hint's adapter
    "sampling.validator_temperature": 0.3, "sampling.validator_top_p": 0.9,
    "sampling.validator_top_k": 0, "sampling.validator_max_new_tokens": 16384,
    "spade.self_validation": False,  # use_env_validator (on in the tool-use recipes)
    "spade.plays_per_env": 8, "spade.hint_plays_per_env": 16, "spade.hint_plays_when": "regen",
    "spade.global_batch_size": 192, "spade.compact_filter": False,
    # orchestrator Stage 4 ceil(global_batch_size / games) plays, Stage 7 upsampling
    "spade.fill_batch": True,
    "spade.top_up": True,  # orchestrator Stage 2: len(game_files) < min_games designs the rest
    # SyntheticGameEnv.step answers a raising step with -1, terminated; orchestrator hit_eos
    "spade.step_errors": "lose", "spade.cut_reply_truncates": True,
    "spade.game_turns": True,  # make_synthetic_env(respect_game_max_turns=True) for plays
    # spade_rollout.py builds a new orchestrator, so an empty _hung_game_blacklist, per rollout
    "spade.keep_blacklist": False,
    "spade.keep_last_pool": False,  # orchestrator Stage 1 cleanup_old_games at every regen
    "spade.failed_plays": "drop", "spade.penalize_invalid": False, "spade.designer_delay": 4,
    "spade.final_flush": True, "spade.lp_update": "before_scoring",
    "spade.role_scale_counts": "valid", "spade.regen_interval": 4, "spade.max_turns": 25,
    # --rollout-batch-size 24, --spade-skills-per-regen 3, max_attempts 5, --num-rollout 400
    "spade.games_per_cycle": 24, "spade.skills_per_regen": 3, "spade.max_attempts": 5,
    "total_cycles": 400,
    "spade.blend.plateau_weight": 0.6, "spade.blend.regret_weight": 0.4,
    "spade.blend.regret_scale": 0.15, "spade.blend.regret_floor": True,
    "spade.blend.plateau_lo": 0.4, "spade.blend.plateau_hi": 0.6,
    "spade.blend.plateau_ramp": 0.25,
    "sandbox.step_timeout_s": 30.0, "sandbox.validation_timeout_s": 60.0,
    "sandbox.play_timeout_s": 300.0,
    "train.kl_coef": 0.0, "spade.replay_per_cycle": 0, "memory.mode": "fifo",
    "memory.capacity": 200, "corpus.max_words": 6000, "spade.matched_timing": True,
    "spade.reward_variant": "blend", "spade.hint_mode": "self",
    "train.learning_rate": 1e-6, "train.weight_decay": 0.1, "train.b1": 0.9, "train.b2": 0.98,
    "train.grad_clip": 1.0, "train.clip_low": 0.2, "train.clip_high": 0.28,
}


def value_at(cfg, path: str):
    for key in path.split("."):
        cfg = cfg[key]
    return cfg


@pytest.mark.parametrize("path", sorted(REFERENCE_DEFAULTS))
def test_each_default_is_the_references(path):
    assert value_at(base_config(), path) == REFERENCE_DEFAULTS[path]


def test_unknown_modes_name_the_choices_by_key_path():
    cfg = load_config_file("tiny")
    cfg.spade.failed_plays = "ignore"
    cfg.spade.hint_plays_when = "never"
    cfg.spade.lp_update = "later"
    cfg.spade.role_scale_counts = "all"
    cfg.spade.blend.plateau_ramp = 0.0
    cfg.sampling.hint_top_k = -1
    with pytest.raises(ConfigError) as err:
        parse(cfg)
    message = str(err.value)
    for expected in ("spade.failed_plays='ignore': use one of ('drop', 'score')",
                     "spade.hint_plays_when='never': use one of ('regen', 'every_cycle')",
                     "spade.lp_update='later': use one of ('before_scoring', 'after_scoring')",
                     "spade.role_scale_counts='all': use one of ('valid', 'trained')",
                     "spade.blend.plateau_ramp=0.0 must be > 0",
                     "sampling.hint_top_k=-1 must be in 0..64"):
        assert expected in message, message


# ----------------------------------------------------------------------------- failed plays
def episode(reward: float | None, hint=None):
    """A finished play: terminated with `reward`, or crashed in the sandbox (None)."""
    spec = EpisodeSpec("e", "class EEnv: pass", 0, hint=hint)
    return Episode(spec, np.zeros(2, np.int32), np.zeros(2, bool), np.zeros(2, np.float32),
                   rewards=[] if reward is None else [reward], terminated=reward is not None,
                   status="ok" if reward is not None else "crashed", turns=1,
                   generated_tokens=1, hint=hint)


def test_the_compact_filter_trains_no_token_of_a_play_that_did_not_terminate():
    """Reference --spade-compact-filter: TRUNCATED (and TIMEOUT: neither terminated nor
    truncated) actor samples get a zero loss mask; FAILED ones are not its business."""
    from spade_jax.spade.loop import agent_sample

    finished, cut_off, crashed = episode(1.0), episode(0.0), episode(None)
    cut_off.terminated = False
    for e in (finished, cut_off, crashed):
        e.loss_mask = np.array([False, True])
    masks = [agent_sample(e, 0.5, compact_filter=True).loss_mask.tolist()
             for e in (finished, cut_off, crashed)]
    assert masks == [[False, True], [False, False], [False, True]]
    assert agent_sample(cut_off, 0.5).loss_mask.tolist() == [False, True]  # filter off


@pytest.mark.parametrize("seed", [0, 3, 2**31 - 1])
def test_the_fixed_pool_is_played_in_batches_without_replacement(seed):
    """Reference --spade-static-game-pool --spade-no-replacement: 24 games per rollout, the
    whole pool used before any game is reused, never twice in one batch."""
    from spade_jax.spade.loop import fixed_pool_batch

    size, per_cycle = 10, 4
    batches = [fixed_pool_batch(size, per_cycle, c, seed) for c in range(30)]
    assert all(len(b) == len(set(b)) == per_cycle for b in batches)
    played = [i for b in batches for i in b]
    assert set(played[:size]) == set(range(size))  # the first pass holds the whole pool
    # later passes too, give or take the refill's skip of a batch's own picks
    assert all(set(played[k:k + 2 * size]) == set(range(size)) for k in range(len(played)
                                                                              - 2 * size))
    assert batches == [fixed_pool_batch(size, per_cycle, c, seed) for c in range(30)]
    assert batches != [fixed_pool_batch(size, per_cycle, c, seed ^ 1) for c in range(30)]
    assert fixed_pool_batch(3, per_cycle, 7, seed) == [0, 1, 2]  # a small pool plays whole


def test_memory_keeps_an_environments_regen_cycle_statistics_unless_it_is_replayed():
    """The reference adds a game to its memory once, at its regen step, with that step's win
    rate; the pool's later plays do not change it. Our memory replays (PLR) refresh it."""
    from spade_jax.spade.loop import HostState, update_memory
    from spade_jax.spade.memory import EnvMemory

    env = DesignedEnv("c00000_s0_Optimization", "Optimization", "class EEnv: pass", None, 0)
    state = HostState(cycle=0, memory=EnvMemory(), pool=[env])
    update_memory(state, [EnvPlays.scored(env, [episode(0.0), episode(1.0)], None)], set())
    state.cycle = 1
    update_memory(state, [EnvPlays.scored(env, [episode(1.0), episode(1.0)], None)], set())
    (record,) = state.memory.records
    assert (record.win_rate, record.last_played) == (0.5, 0)
    update_memory(state, [EnvPlays.scored(env, [episode(1.0), episode(1.0)], None)], {env.env_id})
    (record,) = state.memory.records
    assert (record.win_rate, record.last_played) == (1.0, 1)


def test_skills_rotate_round_robin_by_regen_epoch():
    """Reference select_active_skills: a window of skills_per_regen skills per regen epoch,
    advancing by that many each epoch (wrapping), the same across the epoch's replays."""
    from spade_jax.spade.loop import active_skills

    skills = list("ABCDEF")
    assert [active_skills(skills, 3, r) for r in range(3)] == [
        list("ABC"), list("DEF"), list("ABC")]
    assert [active_skills(skills, 4, r) for r in range(3)] == [
        list("ABCD"), list("EFAB"), list("CDEF")]
    assert active_skills(skills, 6, 5) == skills


def test_failed_plays_are_dropped_before_normalising_or_scored_minus_one():
    env = DesignedEnv("e", "Optimization", "class EEnv: pass", None, 0)
    nohint = [episode(1.0), episode(0.0), episode(None), episode(1.0)]
    hinted = [episode(1.0, "h"), episode(None, "h")]
    dropped = EnvPlays.scored(env, nohint, hinted, R.FailedPlays.DROP)
    assert dropped.nohint_returns == [1.0, 0.0, 1.0]
    assert dropped.trained == [nohint[0], nohint[1], nohint[3]]
    assert dropped.stats.r_nohint == pytest.approx(2 / 3)
    assert dropped.stats.win_rate == pytest.approx(2 / 3)
    # (1 + 0) / 2: the reference's hint arm scores a failed play 0 rather than dropping it
    assert dropped.stats.r_hint == 0.5 and dropped.stats.n_failed == 2
    scored = EnvPlays.scored(env, nohint, hinted, R.FailedPlays.SCORE)
    assert scored.nohint_returns == [1.0, 0.0, -1.0, 1.0] and scored.trained == nohint
    assert scored.stats.r_nohint == pytest.approx(0.25)  # (1 + 0 - 1 + 1) / 4
    assert scored.stats.r_hint == 0.0  # (1 - 1) / 2
    # every play failed: nothing counts, and the means are 0 (reference `_mean_or_zero`)
    none = EnvPlays.scored(env, [episode(None)], [episode(None, "h")], R.FailedPlays.DROP)
    assert none.trained == [] and none.stats.r_nohint == 0.0 and none.stats.regret == 0.0


# ----------------------------------------------------------------------------- blend
def test_blend_parameters_golden():
    """0.6 * plateau(win; band, ramp) + 0.4 * clip(regret / scale, 0, 1), by hand."""
    paper = R.BlendParams()
    assert paper.reward(0.06, 0.5) == pytest.approx(0.6 * 1.0 + 0.4 * 0.4)  # 0.76
    assert paper.reward(0.06, 0.25) == pytest.approx(0.6 * 0.4 + 0.4 * 0.4)  # 1 - 0.15/0.25
    # the 4B second phase (cmd/games/README.md): band [0.2, 0.4], ramp 0.2
    late = R.BlendParams(plateau_lo=0.2, plateau_hi=0.4, plateau_ramp=0.2)
    assert late.reward(0.06, 0.5) == pytest.approx(0.6 * 0.5 + 0.4 * 0.4)  # 0.46
    assert late.reward(0.06, 0.3) == pytest.approx(0.6 + 0.16)
    assert R.BlendParams(regret_scale=0.3).reward(0.06, 0.5) == pytest.approx(0.6 + 0.4 * 0.2)
    assert R.BlendParams(regret_scale=0.3).reward(0.6, 0.5) == pytest.approx(1.0)  # clipped
    assert R.BlendParams(regret_floor=False).reward(0.3, 0.5) == pytest.approx(0.6 + 0.8)
    weights = R.BlendParams(plateau_weight=1.0, regret_weight=0.0)  # the solve_rate ablation
    assert weights.reward(0.3, 0.7) == pytest.approx(0.6)  # 1 - 0.1 / 0.25
    assert R.solve_rate_reward(0.3, late) == pytest.approx(1.0)


# ----------------------------------------------------------------------------- designer step
def spade_config(**changes):
    return dataclasses.replace(parse(load_config_file("tiny")).spade, **changes)


def pending(env_id, skill, status=R.DesignerStatus.OK, r_hint=0.0, window=None):
    sample = TrainSample(np.arange(4, dtype=np.int32), np.array([0, 0, 1, 1], bool),
                         np.zeros(4, np.float32), 0.0, Role.DESIGNER)
    return PendingDesign(4, 0, sample, skill, status, env_id, r_hint,
                         WindowReturns(window or {}))


def lp_due():
    """Skill A: env1 won all 6 window plays, env2 lost both of its 2."""
    return [pending("env1", "A", window={0: [1.0] * 3, 1: [1.0] * 3}),
            pending("env2", "A", window={0: [0.0, 0.0]})]


def test_learning_potential_tracker_advances_before_scoring_over_pooled_plays():
    state = SimpleNamespace(blacklist=set(), learning_potentials={})
    s = spade_config(reward_variant=R.RewardVariant.LEARNING_POTENTIAL)
    _, raw = designer_samples_for(s, state, lp_due(), n_agent=8)
    # pooled mean 6/8 = 0.75 initialises the tracker; raw = |win - 0.75|
    np.testing.assert_allclose(raw, [0.25, 0.75])
    assert state.learning_potentials["A"].mu_slow == pytest.approx(0.75)
    # a second cycle: mu_slow = 0.15 * 0.75 + 0.85 * 0.75 (same pooled mean) stays 0.75
    prior = {"A": R.LearningPotentialState(mu_fast=0.5, mu_slow=0.5)}
    state = SimpleNamespace(blacklist=set(), learning_potentials=prior)
    _, raw = designer_samples_for(s, state, lp_due(), n_agent=8)
    mu_slow = 0.15 * 0.5 + 0.85 * 0.75  # 0.7125
    np.testing.assert_allclose(raw, [1.0 - mu_slow, mu_slow])


def test_learning_potential_after_scoring_uses_the_old_tracker_then_mean_win_rates():
    state = SimpleNamespace(blacklist=set(), learning_potentials={})
    s = spade_config(reward_variant=R.RewardVariant.LEARNING_POTENTIAL,
                     lp_update=R.LPUpdate.AFTER_SCORING)
    _, raw = designer_samples_for(s, state, lp_due(), n_agent=8)
    np.testing.assert_allclose(raw, [1.0, 0.0])  # fresh tracker: baseline 0
    assert state.learning_potentials["A"].mu_slow == pytest.approx(0.5)  # (1 + 0) / 2


def regret_due():
    """Skill A: regrets 0.75 - 0.25 = 0.5 and 0.35 - 0.25 = 0.1; skill B: two invalid."""
    return [pending("env1", "A", r_hint=0.75, window={0: [0.25, 0.25]}),
            pending("env2", "A", r_hint=0.35, window={0: [0.25, 0.25]}),
            pending("bad1", "B", status=R.DesignerStatus.INVALID),
            pending("bad2", "B", status=R.DesignerStatus.INVALID)]


@pytest.mark.parametrize("counts, scale", [(R.RoleScaleCounts.VALID, 32.0),  # 16 / 2 * 4
                                           (R.RoleScaleCounts.TRAINED, 16.0)])  # 16 / 4 * 4
def test_role_scale_counts_valid_environments_only(counts, scale):
    state = SimpleNamespace(blacklist=set(), learning_potentials={})
    s = spade_config(reward_variant=R.RewardVariant.REGRET, penalize_invalid=True,
                     regen_interval=4, role_scale_counts=counts)
    samples, raw = designer_samples_for(s, state, regret_due(), n_agent=16)
    np.testing.assert_allclose(raw, [0.5, 0.1, -1.0, -1.0])
    np.testing.assert_allclose([x.advantage for x in samples],
                               [0.2 * scale, -0.2 * scale, 0.0, 0.0])


def test_invalid_designs_are_never_trained_by_default():
    state = SimpleNamespace(blacklist=set(), learning_potentials={})
    s = spade_config(reward_variant=R.RewardVariant.REGRET, regen_interval=4)
    assert s.penalize_invalid is False
    samples, raw = designer_samples_for(s, state, regret_due(), n_agent=16)
    assert len(samples) == 2 and len(raw) == 4  # the invalid two are scored, not trained
    np.testing.assert_allclose([x.advantage for x in samples], [6.4, -6.4])


def test_the_last_cycle_flushes_every_waiting_designer_sample():
    waiting = [dataclasses.replace(pending("a", "A"), due=5),
               dataclasses.replace(pending("b", "A"), due=6)]
    assert split_due(waiting, 5) == (waiting[:1], waiting[1:])
    assert split_due(waiting, 3) == ([], waiting)
    assert split_due(waiting, 3, flush=True) == (waiting, [])


def test_hint_plays_only_for_the_environments_designed_at_a_regen_cycle():
    played = ["new1", "new2", "replay"]
    assert HintSchedule.REGEN.hinted(played, {"new1", "new2"}) == {"new1", "new2"}
    assert HintSchedule.REGEN.hinted(played, set()) == set()  # a replay-only cycle
    assert HintSchedule.EVERY_CYCLE.hinted(played, set()) == set(played)
    # and only for the variants that read regret
    assert [v for v in R.RewardVariant if v.needs_hints] == ["regret", "blend"]


# ----------------------------------------------------------------------------- recipes
RECIPES = {  # config -> (game type, delay, KL, Designer tokens, hint tokens, regen, corpus words,
    #                     self-validation: --spade-use-env-validator)
    "30b": ("game", 4, 0.0, 16384, 4096, 4, 6000, False),  # cmd/games/train_spade_30b.sh
    "4b": ("game", 4, 0.0, 16384, 4096, 4, 6000, False),  # cmd/games/train_spade_4b.sh
    "8b": ("game", 4, 0.005, 20000, 4096, 4, 6000, False),  # cmd/games/train_spade_8b.sh
    # cmd/tool_use/_train_spade_blend.sh with TOOL_MODEL_SIZE=30b
    "30b_tool_use": ("tool_use", 8, 0.005, 16384, 2048, 8, 4000, True),
}


@pytest.mark.parametrize("name", sorted(RECIPES))
def test_recipe_configs_carry_the_references_deltas(name):
    run = parse(load_config_file(name))
    s, smp = run.spade, run.sampling
    got = (s.game_type.value, s.designer_delay, run.train.kl_coef, smp.designer_max_new_tokens,
           smp.hint_max_new_tokens, s.regen_interval, run.corpus.max_words, s.self_validation)
    assert got == RECIPES[name]
    # shared by every recipe: 0.6 both roles, top-p 0.95, top-k 20, 8192 per turn, 32k, 25 turns
    assert smp.agent == Decoding(temperature=0.6, top_p=0.95, top_k=20, max_new_tokens=8192)
    assert (smp.designer.temperature, smp.designer.top_p, smp.designer.top_k) == (0.6, 0.95, 20)
    assert (smp.max_context, s.max_turns, s.hint_plays_per_env, s.plays_per_env) == (
        32768, 25, 16, 8)
    assert set(s.skills) == set(s.game_type.skills) and len(s.skills) == 6
    # --spade-compact-filter in the tool-use recipes only
    assert s.compact_filter == (s.game_type.value == "tool_use")

