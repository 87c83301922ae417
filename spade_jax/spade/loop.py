"""One SPADE cycle, composed from small modules (docs/DESIGN.md §4.1).

    design (regen cycles) → hints → play without / with hint → regret and rewards →
    advantages → one policy-gradient step on Designer + Agent samples → memory

Every environment of the pool is played `spade.plays_per_env` times without hint (8 by
default; with `spade.fill_batch`, as the reference, a pool short of `global_batch_size / 8`
environments plays each more and duplicates Agent samples to fill the batch). With
`spade.hint_plays_when='regen'` (the default) only the environments designed this cycle are
also played `spade.hint_plays_per_env` times with it (16 by default).

The device side (generation, multi-turn sampling, the train step) and the sandboxed environments
are reached through a `Runtime` (spade/runtime.py); everything here is host-side bookkeeping.
`mode='fixed'` is the paper's fixed-environment baseline: the same Agent training on a fixed
pool of environments, no Designer.
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from typing import TYPE_CHECKING, Any

import numpy as np

from spade_jax.rl.advantages import group_zscore_advantages
from spade_jax.seeding import SEED_LIMIT, derive_rng, derive_seed
from spade_jax.spade import hints as hint_lib
from spade_jax.spade import prompts, regret, rewards
from spade_jax.spade.batch import Role, TrainSample, fill_indices, order_for_training
from spade_jax.spade.delayed import PendingDesign, due_outcome, record_plays, split_due
from spade_jax.spade.designer import (
    DesignAttempt,
    DesignedEnv,
    design_environments,
    env_id_for,
)
from spade_jax.spade.envrunner import ENV_HINT
from spade_jax.spade.hints import HintMode, HintStatus
from spade_jax.spade.memory import EnvMemory, new_record, replay_weights
from spade_jax.spade.rewards import DesignerStatus, FailedPlays
from spade_jax.spade.rollout import Decoding, Episode, EpisodeSpec, EpisodeStatus
from spade_jax.spade.self_validation import Verdict, parse_verdict, self_validation_messages

if TYPE_CHECKING:
    from spade_jax.config import RunConfig, SamplingConfig, SpadeConfig


@dataclasses.dataclass
class HostState:
    """Everything host-side that a checkpoint must restore for an exact resume."""

    cycle: int
    memory: EnvMemory
    pool: list[DesignedEnv]  # environments played between regenerations
    blacklist: set[str] = dataclasses.field(default_factory=set)
    learning_potentials: dict[str, rewards.LearningPotentialState] = dataclasses.field(
        default_factory=dict)
    # Designer samples waiting `spade.designer_delay` cycles for their windowed reward.
    pending_designs: list[PendingDesign] = dataclasses.field(default_factory=list)

    def to_json(self) -> dict:
        return {
            "cycle": self.cycle,
            "memory": self.memory.to_dict(),
            "pool": [dataclasses.asdict(dataclasses.replace(e, attempt=None)) for e in self.pool],
            "blacklist": sorted(self.blacklist),
            "learning_potentials": {k: v.to_dict() for k, v in self.learning_potentials.items()},
            "pending_designs": [d.to_json() for d in self.pending_designs],
        }

    @classmethod
    def from_json(cls, data: dict) -> HostState:
        return cls(
            cycle=int(data["cycle"]),
            memory=EnvMemory.from_dict(data["memory"]),
            pool=[DesignedEnv(**e) for e in data["pool"]],
            blacklist=set(data["blacklist"]),
            learning_potentials={k: rewards.LearningPotentialState.from_dict(v)
                                 for k, v in data["learning_potentials"].items()},
            pending_designs=[PendingDesign.from_json(d)
                             for d in data.get("pending_designs", [])],
        )


def episode_seed(run_seed: int, cycle: int, env_id: str, play: int) -> int:
    """Counter-derived episode seed: the same (run, cycle, env, play) always gives the same seed.

    Hint play i and no-hint play i share a seed, so their difference has low variance.
    """
    return derive_seed(run_seed, cycle, env_id, play)


def play_seed(run_seed: int, cycle: int) -> int:
    """Sampling seed of the Agent's plays in `cycle`, for every turn (token keys add the
    episode and its position, `play_episodes`)."""
    return derive_seed(run_seed, "play", cycle)


def cycle_rng(run_seed: int, cycle: int, stream: int) -> np.random.Generator:
    """Independent seeded generator per (run, cycle, purpose)."""
    return derive_rng(run_seed, cycle, stream)


def active_skills(skills, skills_per_regen: int, regen_index: int) -> list[str]:
    """Round-robin window of `skills_per_regen` skills for the `regen_index`-th regeneration."""
    start = (regen_index * skills_per_regen) % len(skills)
    return [skills[(start + i) % len(skills)] for i in range(skills_per_regen)]


def fixed_pool_batch(pool_size: int, per_cycle: int, cycle: int, seed: int) -> list[int]:
    """Indices of the fixed pool played at `cycle`: `per_cycle` of them, the whole pool used
    before any is reused (reference `_select_static_games_without_replacement`: a shuffled
    queue, refilled with a fresh shuffle that skips the batch's own picks). A pure function of
    its arguments, so a resumed run plays what an uninterrupted one would; a pool no larger
    than `per_cycle` is played whole, in its order."""
    if pool_size <= per_cycle:
        return list(range(pool_size))
    rng = derive_rng(seed, "fixed_pool")
    queue = rng.permutation(pool_size).tolist()
    for _ in range(cycle + 1):
        batch, queue = queue[:per_cycle], queue[per_cycle:]
        if len(batch) < per_cycle:
            picked = set(batch)
            refill = [i for i in rng.permutation(pool_size).tolist() if i not in picked]
            needed = per_cycle - len(batch)
            batch, queue = batch + refill[:needed], refill[needed:]
    return batch


def designer_sample(rt, attempt: DesignAttempt, advantage: float) -> TrainSample:
    """Training sample of one Designer generation (prompt tokens are not trained)."""
    prompt_ids = rt.chat.prompt(attempt.messages)
    completion = attempt.completion
    tokens = np.asarray(list(prompt_ids) + list(completion.tokens), np.int32)
    mask = np.zeros(len(tokens), bool)
    mask[len(prompt_ids):] = True
    logp = np.zeros(len(tokens), np.float32)
    logp[len(prompt_ids):] = np.asarray(completion.logprobs, np.float32)
    return TrainSample(tokens, mask, logp, float(advantage), Role.DESIGNER)


def agent_sample(episode: Episode, advantage: float, weight: float = 1.0,
                 compact_filter: bool = False) -> TrainSample:
    """The training sample of a no-hint play. With `compact_filter` (reference
    --spade-compact-filter, on in its tool-use recipes) a play that ended without terminating
    (turn limit, full context) trains no token: running out of turns is the environment's
    budget, and training on its return 0 would teach the Agent to answer early."""
    mask = episode.loss_mask
    if compact_filter and not episode.terminated and not episode.failed:
        mask = np.zeros_like(mask)
    return TrainSample(episode.tokens, mask, episode.behaviour_logp, float(advantage),
                       Role.AGENT, weight)


def run_designer(
    rt, s: SpadeConfig, sampling: SamplingConfig, state: HostState, corpus, rng, slots: int,
    with_hints: bool = True,
) -> tuple[list[DesignAttempt], list[DesignedEnv]]:
    """Ask the Designer for `slots` environments (with retries), the skills of the regen
    epoch's window in turn from its first, and (`with_hints`) their hints."""
    regen_index = state.cycle // s.regen_interval
    window = active_skills(list(s.skills), s.skills_per_regen, regen_index)
    slot_skills = [window[i % len(window)] for i in range(slots)]
    examples = prompts.worked_example(rt.seed_envs, s.game_type)

    def build_prompt(slot, skill, attempt):
        document = None if (s.no_corpus or corpus is None) else corpus.sample(rng)
        memory = None if s.no_memory else state.memory.retrieve(skill, rng)
        messages = prompts.designer_messages(
            skill=skill, document=document.text if document else None, memory=memory,
            example_code=examples, max_turns=s.max_turns, game_type=s.game_type)
        return messages, (document.doc_id if document else None)

    def generate(messages_list):
        return rt.generate(messages_list, sampling.designer, seed=int(rng.integers(SEED_LIMIT)))

    def judge(codes):
        """The policy's self-validation verdict (and its reasoning) on each environment."""
        completions = rt.generate([self_validation_messages(c, s.game_type)
                                   for c in codes],
                                  sampling.validator, seed=int(rng.integers(SEED_LIMIT)))
        return [(parse_verdict(c.text), c.text) for c in completions]

    attempts, admitted = design_environments(
        slot_skills, cycle=state.cycle, build_prompt=build_prompt, generate=generate,
        validate_many=rt.validate_many, max_attempts=s.max_attempts,
        judge=judge if s.self_validation else None)
    admitted = [e for e in admitted if not state.memory.contains_hash_of(e.code)]
    if with_hints and s.reward_variant.needs_hints:
        write_hints(rt, s, sampling, admitted, rng)
    return attempts, admitted


def write_hints(rt, s: SpadeConfig, sampling: SamplingConfig, envs: list[DesignedEnv],
                rng) -> None:
    """Fill `env.hint` per the hint mode (the env runner leak-checks it per episode); an empty
    reply is asked again, up to `hints.HINT_ATTEMPTS` calls in all, as the reference."""
    if s.hint_mode == HintMode.DESIGNER:
        for env in envs:
            env.hint = ENV_HINT
        return
    for _ in range(hint_lib.HINT_ATTEMPTS):
        if not envs:
            return
        completions = rt.generate([hint_lib.hint_messages(e.code, s.game_type) for e in envs],
                                  sampling.hint, seed=int(rng.integers(SEED_LIMIT)))
        for env, completion in zip(envs, completions, strict=True):
            env.hint = hint_lib.clean_hint(completion.text) or ""
        envs = [e for e, c in zip(envs, completions, strict=True) if not c.text]


@dataclasses.dataclass(frozen=True)
class EnvPlays:
    """One environment's plays of a cycle: K without hint, those with hint (None in a cycle
    without hint plays of it; play i of both shares seed i), the plays that count
    (`FailedPlays`), and the regret statistics of their returns.

    A hint play counts only if it was shown the hint: when none was (the hint call gave
    nothing, or every episode dropped the hint as empty or leaking), the hint side has mean
    0, as the reference's regret when hint generation fails, rather than the return of
    plays without a hint, whose noise a floored regret would reward. A hint play that failed
    (crashed or timed out) counts as `FailedPlays.hint_return` says: 0 by default, as the
    reference's hint arm, which scores a game that failed to load or hung 0."""

    env: DesignedEnv
    nohint: list[Episode]
    hinted: list[Episode] | None
    stats: regret.PlayStats
    failed_plays: FailedPlays = FailedPlays.DROP

    @classmethod
    def scored(cls, env: DesignedEnv, nohint: list[Episode], hinted: list[Episode] | None,
               failed_plays: FailedPlays = FailedPlays.DROP) -> EnvPlays:
        """The plays of `env` with the statistics of those that count."""
        hint_returns = (None if hinted is None else [
            failed_plays.hint_return(e) for e in hinted if e.failed or e.hint is not None])
        stats = regret.play_stats(env.env_id, env.skill,
                                  [e.episode_return for e in failed_plays.kept(nohint)],
                                  hint_returns,
                                  n_failed=sum(e.failed for e in nohint + (hinted or [])))
        return cls(env, nohint, hinted, stats, failed_plays)

    @property
    def episodes(self) -> list[Episode]:
        return self.nohint + (self.hinted or [])

    @property
    def trained(self) -> list[Episode]:
        """The no-hint plays that count: the Agent's training samples of this environment."""
        return self.failed_plays.kept(self.nohint)

    @property
    def nohint_returns(self) -> list[float]:
        """Returns of the no-hint plays that count."""
        return [e.episode_return for e in self.trained]


def play_pool(rt, s: SpadeConfig, agent: Decoding, run_seed: int, cycle: int,
              envs: list[DesignedEnv], hinted_ids: set[str]) -> list[EnvPlays]:
    """`s.no_hint_plays` plays without hint of every env and `s.hint_plays_per_env` with hint
    of those in `hinted_ids` that have a hint (none for an empty one: `EnvPlays`), all in one
    batch; hint play i shares no-hint play i's seed."""
    k, k_hint = s.no_hint_plays(len(envs)), s.hint_plays_per_env
    spec_pairs = []
    for env in envs:
        seeds = [episode_seed(run_seed, cycle, env.env_id, i) for i in range(max(k, k_hint))]
        hinted = None
        if env.env_id in hinted_ids:  # no hint written: no hint plays
            hinted = ([EpisodeSpec(env.env_id, env.code, sd, hint=env.hint,
                                   end_on_cut_reply=s.cut_reply_truncates
                                   and s.game_type.hint_plays_end_on_cut_reply)
                       for sd in seeds[:k_hint]] if env.hint else [])
        spec_pairs.append(([EpisodeSpec(env.env_id, env.code, sd,
                                        end_on_cut_reply=s.cut_reply_truncates)
                            for sd in seeds[:k]], hinted))
    results = iter(rt.play([spec for nohint, hinted in spec_pairs
                            for spec in nohint + (hinted or [])],
                           agent, seed=play_seed(run_seed, cycle)))
    return [EnvPlays.scored(env, [next(results) for _ in nohint],
                            None if hinted is None else [next(results) for _ in hinted],
                            s.failed_plays)
            for env, (nohint, hinted) in zip(envs, spec_pairs, strict=True)]


def run_cycle(rt, run: RunConfig, state: HostState, corpus, artifacts) -> dict[str, float]:
    """One SPADE (or fixed-mode) cycle; mutates `state` and returns its metrics.

    The cycle composes the steps below and hands each one the records it needs."""
    s, total_cycles = run.spade, run.total_cycles
    rng = cycle_rng(run.seed, state.cycle, 0)
    metrics: dict[str, float] = {}
    attempts: list[DesignAttempt] = []
    designed: set[str] = set()  # this regen cycle's new environments
    topped_up: list[DesignedEnv] = []
    regen = state.cycle % s.regen_interval == 0
    if not run.mode.designs:
        if not state.pool:
            state.pool = rt.fixed_pool()
    elif regen:
        attempts, admitted = run_designer(rt, s, run.sampling, state, corpus, rng,
                                          slots=s.games_per_cycle)
        metrics.update(validation_metrics(attempts, self_validation=s.self_validation))
        metrics["novelty"] = state.memory.novelty([e.code for e in admitted]).novelty
        designed = {e.env_id for e in admitted}
        if admitted or not s.keep_last_pool:
            state.pool = admitted  # the reference deletes the last pool's games at a regen
        if not admitted:
            rt.log("no valid environment this cycle: the Agent plays "
                   + ("the last pool" if state.pool else "memory replays only, if any"))
    elif s.top_up and len(state.pool) < s.games_per_cycle:
        # reference Stage 2: a games dir short of its games is refilled at the next rollouts;
        # without a hint phase those designs carry no reward signal, so they are not trained
        attempts, admitted = run_designer(rt, s, run.sampling, state, corpus, rng,
                                          slots=s.games_per_cycle - len(state.pool),
                                          with_hints=False)
        topped_up = [dataclasses.replace(e, top_up=True) for e in admitted]
        metrics.update(validation_metrics(attempts, self_validation=s.self_validation))
        metrics["designer/topped_up"] = len(topped_up)
        state.pool = state.pool + topped_up

    replayed = []
    if not s.no_memory and s.replay_per_cycle > 0:
        for record, prob in state.memory.sample_for_replay(s.replay_per_cycle, rng, state.cycle):
            replayed.append((DesignedEnv(record.id, record.skill, record.code, record.doc_id,
                                         record.cycle, hint=record.hint or ""), prob))
    pool = state.pool if run.mode.designs else [state.pool[i] for i in fixed_pool_batch(
        len(state.pool), s.games_per_cycle, state.cycle, run.seed)]
    pool = [e for e in pool if e.env_id not in state.blacklist]
    pool_ids = {e.env_id for e in pool}
    played_envs = pool + [e for e, _ in replayed]
    hinted_ids = (s.hint_plays_when.hinted([e.env_id for e in played_envs], designed)
                  if s.reward_variant.needs_hints else set())
    unhinted = [e for e in topped_up + [e for e, _ in replayed]
                if e.env_id in hinted_ids and not e.hint]
    if unhinted:
        write_hints(rt, s, run.sampling, unhinted, rng)
    plays = (play_pool(rt, s, run.sampling.agent, run.seed, state.cycle, played_envs, hinted_ids)
             if played_envs else [])

    timed_out = {p.env.env_id for p in plays
                 if any(e.status == EpisodeStatus.TIMEOUT for e in p.episodes)}
    if s.keep_blacklist:
        state.blacklist |= timed_out

    # Agent: per-environment z-scores over the no-hint plays that count (failed ones dropped
    # before normalising, `spade.failed_plays`); hint plays are never trained.
    replay_weight = {e.env_id: 1.0 for e in pool}
    replay_weight.update(zip([e.env_id for e, _ in replayed],
                             replay_weights([p for _, p in replayed]), strict=True))
    counted = [p for p in plays if p.trained]  # an env whose plays all failed trains nothing
    groups = group_zscore_advantages([p.nohint_returns for p in counted]) if counted else None
    agent_samples, from_pool = [], []
    for played, adv in zip(counted, groups.advantages if groups else [], strict=True):
        agent_samples += [agent_sample(e, a, replay_weight[played.env.env_id],
                                       s.compact_filter)
                          for e, a in zip(played.trained, adv, strict=True)]
        from_pool += [played.env.env_id in pool_ids] * len(played.trained)
    if s.compact_filter:
        metrics["agent/compact_filtered"] = float(sum(
            not e.terminated and not e.failed for p in counted for e in p.trained))
    if s.fill_batch and s.global_batch_size:
        # as the reference, this regen cycle's designs keep their room in the batch
        new_designs = 0 if s.no_designer_training else len(designed)
        fill = fill_indices(len(agent_samples), s.global_batch_size - new_designs)
        metrics["samples/upsampled"] = len(fill) - len(agent_samples)
        agent_samples = [agent_samples[i] for i in fill]
        from_pool = [from_pool[i] for i in fill]
    n_agent = s.role_scale_counts.agent_count(len(agent_samples), sum(from_pool))

    if regen and attempts and not s.no_designer_training:
        state.pending_designs += pending_designs_for(rt, state, attempts, plays, timed_out,
                                                     due=state.cycle + s.designer_delay)
    record_plays(state.pending_designs, state.cycle,
                 {p.env.env_id: p.nohint_returns for p in plays})
    due, state.pending_designs = split_due(
        state.pending_designs, state.cycle,
        flush=s.final_flush and state.cycle == total_cycles - 1)
    designer_samples, raw = designer_samples_for(s, state, due, n_agent)
    if len(raw):
        metrics["designer/reward_mean"] = float(np.mean(raw))

    samples = order_for_training(designer_samples + agent_samples,
                                 max_samples=s.global_batch_size or None)
    metrics["samples/trimmed"] = len(designer_samples) + len(agent_samples) - len(samples)
    if samples:
        metrics.update(rt.train(samples))
    update_memory(state, plays, {e.env_id for e, _ in replayed})
    artifacts.write_cycle(state.cycle, attempts, plays)
    metrics.update(play_metrics(plays, groups, len(designer_samples), len(agent_samples)))
    state.cycle += 1
    return metrics


def pending_designs_for(rt, state, attempts, plays: list[EnvPlays], timed_out: set[str],
                        due: int) -> list[PendingDesign]:
    """Every scored Designer attempt of this regen cycle as a sample waiting for `due`, with
    status `step_timeout` when one of its plays (`timed_out`) timed out.

    A valid duplicate of a memory environment is neither played nor trained.
    """
    by_env = {p.env.env_id: p.stats for p in plays}
    pending = []
    for attempt in attempts:
        env_id = env_id_for(state.cycle, attempt.slot, attempt.skill)
        if not attempt.valid:
            status, r_hint = DesignerStatus.INVALID, 0.0
        elif env_id in by_env:
            status = DesignerStatus.STEP_TIMEOUT if env_id in timed_out else DesignerStatus.OK
            r_hint = by_env[env_id].r_hint or 0.0
        else:
            continue
        pending.append(PendingDesign(due, state.cycle, designer_sample(rt, attempt, 0.0),
                                     attempt.skill, status, env_id, r_hint))
    return pending


def designer_samples_for(
    s: SpadeConfig, state, due: list[PendingDesign], n_agent: int
) -> tuple[list[TrainSample], np.ndarray]:
    """The due Designer samples with their advantages, and the raw rewards of all of them.

    Rewards follow the variant, penalties, per-skill centring and role scale (docs/DESIGN.md §4.6),
    over each sample's delay window (only the regen cycle itself when the delay is 0).
    """
    outcomes = [due_outcome(d, s.matched_timing) for d in due]
    if not outcomes:
        return [], np.zeros(0)
    variant = s.reward_variant
    trackers = variant.trackers_for(outcomes, state.learning_potentials)
    before = s.lp_update == rewards.LPUpdate.BEFORE_SCORING
    if before:
        trackers = variant.advance_trackers(outcomes, trackers, pooled=True)
    counted = s.role_scale_counts.designer_statuses(s.penalize_invalid)
    n_designer = sum(1 for o in outcomes if o.status in counted)
    scale = rewards.role_scale(n_agent, n_designer, s.regen_interval)
    result = rewards.designer_rewards(outcomes, variant, scale,
                                      penalize_invalid=s.penalize_invalid,
                                      learning_potentials=trackers, blend=s.blend)
    if not before:
        trackers = variant.advance_trackers(outcomes, trackers, pooled=False)
    state.learning_potentials = trackers
    samples = [dataclasses.replace(d.sample, advantage=float(adv))
               for d, adv, trained in zip(due, result.advantages, result.trained, strict=True)
               if trained]
    return samples, result.raw


def update_memory(state: HostState, plays: list[EnvPlays], replayed_ids: set[str]) -> None:
    """Store new environments with the statistics of their first cycle, as the reference
    records a game once, at its regen step (a top-up, designed between them, never); refresh
    only the memory replays' (PLR scores a revisited level anew), not a stored environment the
    pool plays again."""
    stored = {r.id: r for r in state.memory.records}
    for played in plays:
        env, st = played.env, played.stats
        if env.top_up:
            continue
        if env.env_id in stored:
            if env.env_id not in replayed_ids:
                continue
            old = stored[env.env_id]  # a cycle without hint plays keeps the last regret
            state.memory.update_stats(
                env.env_id, win_rate=st.win_rate, cycle=state.cycle, r_nohint=st.r_nohint,
                regret=old.regret if st.regret is None else st.regret,
                r_hint=old.r_hint if st.r_hint is None else st.r_hint)
        else:
            state.memory.add(new_record(env.env_id, env.skill, env.code, cycle=state.cycle,
                                        hint=None if env.hint == ENV_HINT else env.hint,
                                        win_rate=st.win_rate, regret=st.regret or 0.0,
                                        r_hint=st.r_hint, r_nohint=st.r_nohint,
                                        doc_id=env.doc_id))


def validation_metrics(attempts: list[DesignAttempt],
                       self_validation: bool = False) -> dict[str, float]:
    """Valid-environment rate and failure counts per validation check; with `self_validation`,
    how many designs the policy's verdict accepted, rejected or left without a verdict."""
    out: dict[str, float] = {"designer/attempts": len(attempts),
                             "designer/valid_rate": float(np.mean([a.valid for a in attempts]))
                             if attempts else 0.0}
    failures = defaultdict(int)
    for a in attempts:
        if not a.valid and a.report.failures:
            failures[a.report.failures[0][0]] += 1
    for check, count in failures.items():
        out[f"designer/fail_{check}"] = count
    if self_validation:
        for verdict in Verdict:
            out[f"self_validation/{verdict.value}"] = sum(a.verdict is verdict for a in attempts)
    return out


def play_metrics(plays: list[EnvPlays], groups, n_designer, n_agent) -> dict[str, float]:
    """Regret, hint / no-hint returns, how many hint plays got their hint, sample counts."""
    stats = [p.stats for p in plays]
    out: dict[str, float] = {"samples/designer": n_designer, "samples/agent": n_agent,
                             "envs/played": len(stats)}
    with_hint = [st for st in stats if st.regret is not None]
    if with_hint:
        regrets = np.array([st.regret for st in with_hint])
        out.update({
            "regret/mean": float(regrets.mean()), "regret/median": float(np.median(regrets)),
            "regret/se_mean": float(np.mean([st.regret_se for st in with_hint])),
            "return/hint": float(np.mean([st.r_hint for st in with_hint])),
        })
    if stats:
        out.update({
            "return/nohint": float(np.mean([st.r_nohint for st in stats])),
            "agent/win_rate": float(np.mean([st.win_rate for st in stats])),
            "episodes/failed": float(sum(st.n_failed for st in stats)),
            "episodes/env_errors": float(sum(e.status == EpisodeStatus.ENV_ERROR
                                             for p in plays for e in p.episodes)),
        })
    if groups is not None:
        out["agent/zero_variance_groups"] = groups.n_zero_variance
    if plays:
        eps = [e for p in plays for e in p.episodes]
        out["agent/generated_tokens"] = float(sum(e.generated_tokens for e in eps))
        out["agent/turns_mean"] = float(np.mean([e.turns for e in eps]))
        # a hint play shown no hint (empty, or dropped for containing the solution) does not
        # count, and an environment whose hint call wrote nothing gets no hint plays (EnvPlays)
        out["hints/none_written"] = float(sum(p.hinted is not None and not p.env.hint
                                              for p in plays))
        hinted = [e for p in plays for e in p.hinted or []]
        if hinted:
            out["hints/shown_rate"] = float(np.mean([e.hint is not None for e in hinted]))
            out["hints/leaked"] = float(sum(e.hint_status == HintStatus.LEAK for e in hinted))
    return out


def summarize(history: list[dict[str, Any]]) -> str:
    """Markdown table of the headline figures per cycle, printed at the end of a run."""
    cols = ["designer/valid_rate", "regret/mean", "return/nohint", "return/hint", "train/loss",
            "time/cycle_s"]
    lines = ["| cycle | " + " | ".join(cols) + " |", "|" + "---|" * (len(cols) + 1)]
    for row in history:
        cells = [f"{row[c]:.3f}" if isinstance(row.get(c), (int, float)) else "-" for c in cols]
        lines.append(f"| {row['cycle']} | " + " | ".join(cells) + " |")
    return "\n".join(lines)
