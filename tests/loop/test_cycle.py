"""One SPADE cycle of the tiny model through the real loop: device code, sandbox, files."""

import collections
import json
import types

import numpy as np
import pytest

from spade_jax.config import load_config_file
from spade_jax.sampling import Completion
from spade_jax.seeding import SEED_LIMIT
from spade_jax.spade.driver import run_training
from spade_jax.spade.rollout import EpisodeStatus


def test_tiny_config_runs_a_full_cycle(tmp_path, tiny_runtime):
    cfg = load_config_file("tiny")
    cfg.total_cycles = 1
    history = run_training(cfg, str(tmp_path), runtime=tiny_runtime)
    row = history[0]
    # A random model writes no valid environment: the cycle says so and still trains the Agent
    # on environments replayed from memory (seeded from our seed environments).
    assert row["designer/attempts"] == cfg.spade.games_per_cycle * cfg.spade.max_attempts
    assert row["designer/valid_rate"] == 0.0
    assert row["envs/played"] == cfg.spade.replay_per_cycle
    assert row["samples/agent"] == cfg.spade.replay_per_cycle * cfg.spade.plays_per_env
    assert np.isfinite(row["train/loss"])
    # Invalid designs are never trained (reference: retried silently).
    assert row["samples/designer"] == 0
    for key in ("time/sampling_share", "time/env_share", "time/training_share",
                "throughput/tokens_per_s", "return/nohint"):
        assert key in row, key
    # Hint plays are for environments designed this cycle only (reference): none here.
    assert "regret/mean" not in row and "return/hint" not in row
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["cycle"] for line in lines] == [0]
    assert (tmp_path / "checkpoints" / "1").is_dir()
    assert list((tmp_path / "tensorboard").iterdir())
    rejected = list((tmp_path / "envs" / "cycle_00000" / "rejected").glob("*.json"))
    assert len(rejected) == cfg.spade.games_per_cycle * cfg.spade.max_attempts


@pytest.mark.parametrize("seed", [3, SEED_LIMIT - 1])  # seed 0: the test above
def test_any_run_seed_runs_a_cycle(tmp_path, tiny_runtime, seed):
    """Large run seeds reach the sampler only through derived seeds (it once overflowed)."""
    cfg = load_config_file("tiny")
    cfg.total_cycles = 1
    cfg.seed = seed
    row = run_training(cfg, str(tmp_path), runtime=tiny_runtime)[0]
    assert row["designer/attempts"] == cfg.spade.games_per_cycle * cfg.spade.max_attempts
    assert row["samples/agent"] == cfg.spade.replay_per_cycle * cfg.spade.plays_per_env
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["cycle"] for line in lines] == [0]


def spoil_designs(runtime, monkeypatch, spoiled) -> list[int]:
    """Wrap the scripted Designer so that the answers `spoiled(call, n_answers)` of its call
    `call` (from 0) hold no code (invalid designs); returns the prompt count of each call."""
    scripted, asked = runtime.generate, []
    tokens = runtime.tokenizer.encode("no code", add_special_tokens=False)

    def generate(messages_list, *args, **kwargs):
        out = scripted(messages_list, *args, **kwargs)
        for i in spoiled(len(asked), len(out)):
            out[i] = Completion("no code", tokens, [-1.0] * len(tokens), "stop")
        asked.append(len(messages_list))
        return out

    monkeypatch.setattr(runtime, "generate", generate)
    return asked


@pytest.fixture
def scripted_designer(tiny_runtime, monkeypatch):
    """The Designer answers with seed environments; everything else is the real model."""
    seeds = [e for e in tiny_runtime.seed_envs if "equation_chain" in e.name
             or "sequence_extend" in e.name]
    calls = {"designer": 0}

    def generate(messages_list, *args, **kwargs):  # the tiny config's hints come from the envs
        out = []
        for _ in messages_list:
            # A module constant makes each design new to the memory (it refuses AST duplicates).
            code = seeds[calls["designer"] % len(seeds)].code + f"\nDESIGN_ID = {calls}\n"
            calls["designer"] += 1
            text = f"```python\n{code}\n```"
            tokens = tiny_runtime.tokenizer.encode(text, add_special_tokens=False)[:64]
            out.append(Completion(text, tokens, [-1.0] * len(tokens), "stop"))
        return out

    monkeypatch.setattr(tiny_runtime, "generate", generate)
    return calls


def test_valid_designs_are_played_rewarded_trained_and_remembered(
        tmp_path, tiny_runtime, scripted_designer):
    cfg = load_config_file("tiny")
    cfg.total_cycles = 1
    cfg.spade.replay_per_cycle = 0
    n_designer = cfg.spade.games_per_cycle
    n_agent = cfg.spade.games_per_cycle * cfg.spade.plays_per_env
    cfg.spade.global_batch_size = n_designer + n_agent - 1  # one Agent sample too many
    history = run_training(cfg, str(tmp_path), runtime=tiny_runtime)
    row = history[0]
    assert row["designer/valid_rate"] == 1.0
    assert row["envs/played"] == cfg.spade.games_per_cycle
    assert (row["samples/designer"], row["samples/agent"]) == (n_designer, n_agent)
    assert row["samples/trimmed"] == 1 and row["train/samples"] == n_designer + n_agent - 1
    assert "regret/mean" in row and row["hints/shown_rate"] > 0  # blend reads regret
    cycle_dir = tmp_path / "envs" / "cycle_00000"
    assert len(list(cycle_dir.glob("s*_a0_*.py"))) == cfg.spade.games_per_cycle
    played = [json.loads(p.read_text()) for p in cycle_dir.glob("played_*.json")]
    assert {p["stats"]["n_nohint"] for p in played} == {cfg.spade.plays_per_env}
    # The new environments are in the checkpointed memory with their statistics.
    from spade_jax.checkpoint import Checkpointer

    ck = Checkpointer(str(tmp_path))
    _, host = ck.restore(1, tiny_runtime.device_state())
    ck.close()
    records = host["state"]["memory"]["records"]
    new = [r for r in records if r["id"].startswith("c00000_")]
    assert len(new) == cfg.spade.games_per_cycle
    assert all(r["win_rate"] is not None for r in new)


def test_a_short_pool_plays_more_and_duplicates_agent_samples_to_fill_the_batch(
        tmp_path, tiny_runtime, scripted_designer, monkeypatch):
    """Reference orchestrator Stages 4 and 7: each of the 2 environments is played
    ceil(11 / 2) = 6 times, and when failed plays leave too few Agent samples they are copied
    round-robin until they and the cycle's 2 designs fill the 11-sample batch."""
    cfg = load_config_file("tiny")
    cfg.total_cycles = 1
    cfg.spade.replay_per_cycle = 0
    cfg.spade.fill_batch = True
    cfg.spade.global_batch_size = 11
    asked, play = [], tiny_runtime.play

    def play_then_crash(specs, decoding, *, seed):  # no-hint plays after an env's 2nd crash
        asked.extend(specs)
        episodes = play(specs, decoding, seed=seed)
        kept = collections.Counter()
        for episode in episodes:
            if episode.spec.hint is None:
                kept[episode.spec.env_id] += 1
                if kept[episode.spec.env_id] > 2:
                    episode.status = EpisodeStatus.CRASHED
        return episodes

    monkeypatch.setattr(tiny_runtime, "play", play_then_crash)
    row = run_training(cfg, str(tmp_path), runtime=tiny_runtime)[0]
    no_hint = collections.Counter(s.env_id for s in asked if s.hint is None)
    assert sorted(no_hint.values()) == [6, 6]
    assert row["episodes/failed"] == 8
    assert row["samples/upsampled"] == 9 - 4
    assert (row["samples/designer"], row["samples/agent"]) == (2, 9)
    assert row["samples/trimmed"] == 0 and row["train/samples"] == 11


def test_a_short_pool_is_topped_up_between_regenerations_and_the_top_up_never_trained(
        tmp_path, tiny_runtime, scripted_designer, monkeypatch):
    """Reference orchestrator Stage 2: cycle 0 admits one of its two designs, so cycle 1 (not a
    regen cycle) asks the Designer for the missing one and plays it; without a hint phase it
    has no reward signal, so it is neither trained nor remembered."""
    cfg = load_config_file("tiny")
    cfg.total_cycles = 2  # regen_interval 2: cycle 1 is not a regen cycle
    cfg.spade.replay_per_cycle = 0
    cfg.spade.top_up = True
    asked = spoil_designs(tiny_runtime, monkeypatch, lambda call, n: [1] if call == 0 else [])
    first, second = run_training(cfg, str(tmp_path), runtime=tiny_runtime)
    assert asked == [2, 1]  # the top-up asks for the missing slot only
    assert first["designer/valid_rate"] == 0.5 and first["envs/played"] == 1
    assert second["designer/topped_up"] == 1 and second["envs/played"] == 2
    played = [p.name for p in (tmp_path / "envs" / "cycle_00001").glob("played_c00001_*")]
    assert len(played) == 1
    assert second["samples/designer"] == 1  # cycle 0's valid design (final flush); no top-up
    from spade_jax.checkpoint import Checkpointer

    ck = Checkpointer(str(tmp_path))
    _, host = ck.restore(2, tiny_runtime.device_state())
    ck.close()
    ids = [r["id"] for r in host["state"]["memory"]["records"]]
    assert sum(i.startswith("c00000_") for i in ids) == 1
    assert not any(i.startswith("c00001_") for i in ids)
    assert [e["top_up"] for e in host["state"]["pool"]] == [False, True]


@pytest.mark.parametrize("keep_blacklist", [False, True])
def test_a_timed_out_environment_is_played_again_next_cycle_unless_blacklist_is_kept(
        tmp_path, tiny_runtime, scripted_designer, monkeypatch, keep_blacklist):
    """The reference rebuilds its orchestrator, and so its hung-game blacklist, every rollout:
    an environment whose play timed out is played again at the next one."""
    cfg = load_config_file("tiny")
    cfg.total_cycles = 2  # regen_interval 2: cycle 1 plays cycle 0's pool
    cfg.spade.replay_per_cycle = 0
    cfg.spade.keep_blacklist = keep_blacklist
    cfg.spade.designer_delay, cfg.spade.final_flush = 4, False  # both designs still wait
    play, cycles = tiny_runtime.play, []

    def first_play_times_out_at_cycle_0(specs, decoding, *, seed):
        episodes = play(specs, decoding, seed=seed)
        cycles.append(sorted({s.env_id for s in specs}))
        if len(cycles) == 1:
            episodes[0].status = EpisodeStatus.TIMEOUT
        return episodes

    monkeypatch.setattr(tiny_runtime, "play", first_play_times_out_at_cycle_0)
    first, second = run_training(cfg, str(tmp_path), runtime=tiny_runtime)
    assert first["envs/played"] == 2 and first["episodes/failed"] == 1
    assert second["envs/played"] == (1 if keep_blacklist else 2)
    assert cycles[1] == cycles[0][1:] if keep_blacklist else cycles[1] == cycles[0]
    from spade_jax.checkpoint import Checkpointer

    ck = Checkpointer(str(tmp_path))
    _, host = ck.restore(2, tiny_runtime.device_state())
    ck.close()
    waiting = host["state"]["pending_designs"]
    assert [d["status"] for d in waiting] == ["step_timeout", "ok"]  # either way


@pytest.mark.parametrize("keep_last_pool", [False, True])
def test_a_regeneration_without_a_valid_design_empties_the_pool_unless_kept(
        tmp_path, tiny_runtime, scripted_designer, monkeypatch, keep_last_pool):
    """The reference deletes the last rollout's games before it designs: when none of the new
    designs is valid, its Agent has nothing to play (and the top-up refills the pool next)."""
    cfg = load_config_file("tiny")
    cfg.total_cycles = 2
    cfg.spade.regen_interval = 1  # cycle 1 designs again, and fails
    cfg.spade.replay_per_cycle = 0
    cfg.spade.keep_last_pool = keep_last_pool
    spoil_designs(tiny_runtime, monkeypatch, lambda call, n: range(n) if call > 0 else [])
    first, second = run_training(cfg, str(tmp_path), runtime=tiny_runtime)
    assert first["envs/played"] == 2 and second["designer/valid_rate"] == 0.0
    assert second["envs/played"] == (2 if keep_last_pool else 0)


def test_a_variant_without_regret_plays_no_hint(tmp_path, tiny_runtime, scripted_designer):
    """As the reference, which computes hints for `regret` and `blend` only."""
    cfg = load_config_file("tiny")
    cfg.total_cycles = 1
    cfg.spade.replay_per_cycle = 0
    cfg.spade.reward_variant = "solve_rate"
    row = run_training(cfg, str(tmp_path), runtime=tiny_runtime)[0]
    assert row["envs/played"] == cfg.spade.games_per_cycle
    assert row["samples/designer"] == cfg.spade.games_per_cycle
    assert "regret/mean" not in row and "hints/shown_rate" not in row


def test_delayed_designer_samples_wait_through_a_resume_and_train_when_due(
        tmp_path, tiny_runtime, scripted_designer):
    cfg = load_config_file("tiny")
    cfg.spade.replay_per_cycle = 0
    cfg.spade.designer_delay = 2  # designs of cycle 0 train at cycle 2, after a resume
    cfg.spade.final_flush = False  # else cycle 1, the first run's last, would train them
    cfg.total_cycles = 2
    first = run_training(cfg, str(tmp_path), runtime=tiny_runtime)
    assert [row["samples/designer"] for row in first] == [0, 0]
    assert all("designer/reward_mean" not in row for row in first)
    from spade_jax.checkpoint import Checkpointer

    ck = Checkpointer(str(tmp_path))
    _, host = ck.restore(2, tiny_runtime.device_state())
    ck.close()
    waiting = host["state"]["pending_designs"]
    assert [(d["cycle"], d["due"], d["status"]) for d in waiting] == [(0, 2, "ok")] * 2
    # each window holds the K no-hint returns of cycles 0 and 1 (the pool lives 2 cycles)
    assert [sorted(d["window"]) for d in waiting] == [["0", "1"]] * 2
    assert all(len(plays) == cfg.spade.plays_per_env
               for d in waiting for plays in d["window"].values())
    cfg.total_cycles = 3
    resumed = run_training(cfg, str(tmp_path), runtime=tiny_runtime)
    assert resumed[-1]["cycle"] == 2
    assert resumed[-1]["samples/designer"] == cfg.spade.games_per_cycle
    assert "designer/reward_mean" in resumed[-1]


def test_time_budget_finishes_and_saves_the_cycle_in_progress(tmp_path, tiny_runtime,
                                                               monkeypatch):
    """The driver's clock is one that only a cycle advances (by an hour), so the test does not
    depend on how long start-up or a cycle takes on this machine."""
    from spade_jax.spade import driver

    clock = [0.0]
    real_cycle = driver.run_cycle

    def one_hour_cycle(*args):
        metrics = real_cycle(*args)
        clock[0] += 3600.0
        return metrics

    monkeypatch.setattr(driver, "run_cycle", one_hour_cycle)
    monkeypatch.setattr(driver, "time", types.SimpleNamespace(monotonic=lambda: clock[0]))
    cfg = load_config_file("tiny")
    cfg.total_cycles = 3
    cfg.checkpoint_every = 10  # only the budget stop can explain a checkpoint at cycle 1
    history = run_training(cfg, str(tmp_path), runtime=tiny_runtime, time_budget_s=1800.0)
    assert [row["cycle"] for row in history] == [0]
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["1"]


def test_config_files_load_by_name_or_path_and_name_a_missing_one(tmp_path):
    from spade_jax.config import CONFIGS_DIR

    assert load_config_file("tiny") == load_config_file(CONFIGS_DIR / "tiny.py")
    with pytest.raises(FileNotFoundError, match="nope.py"):
        load_config_file("nope")
