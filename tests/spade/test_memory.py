"""Environment memory: hashing, FIFO vs PLR eviction, retrieval, replay, novelty, persistence."""

import dataclasses
import json

import numpy as np
import pytest

from spade_jax.envs.seeds import list_seed_envs
from spade_jax.spade import memory as M

CODE_X = '''
class CounterEnv:
    """Doc."""
    def __init__(self, max_turns=25, **kwargs):
        self.max_turns = max_turns
        self.reset()

    def reset(self, seed=None):
        self.total = 3
        return "Reach 10.", {}

    def step(self, action):
        self.total += 2
        return f"Total {self.total}", float(self.total == 10), self.total >= 10, False, {}

    def solution(self):
        return "\\\\boxed{add}"
'''

CODE_Y = '''
import random

class MazeRunnerEnv:
    def __init__(self, max_turns=25, **kwargs):
        self.max_turns = max_turns
        self.reset()

    def reset(self, seed=None):
        rng = random.Random(seed)
        self.grid = [[rng.random() < 0.3 for _ in range(5)] for _ in range(5)]
        self.pos = (0, 0)
        return "Find the exit.", {}

    def step(self, action):
        moves = {"n": (-1, 0), "s": (1, 0), "e": (0, 1), "w": (0, -1)}
        dr, dc = moves.get(action.strip()[-2:-1], (0, 0))
        self.pos = (min(4, max(0, self.pos[0] + dr)), min(4, max(0, self.pos[1] + dc)))
        won = self.pos == (4, 4)
        return str(self.pos), 1.0 if won else 0.0, won, False, {}
'''


def code_variant(i):
    return CODE_X.replace("self.total = 3", f"self.total = {i}")


def record(env_id, regret=0.0, win_rate=0.5, skill="A", cycle=0, last_played=None, code=None):
    rec = M.new_record(env_id, skill, code or code_variant(10**6 + sum(map(ord, env_id))),
                       cycle=cycle, win_rate=win_rate, regret=regret)
    if last_played is not None:
        rec = dataclasses.replace(rec, last_played=last_played)
    return rec


def make_memory(mode, entries, capacity=3):
    memory = M.EnvMemory(capacity=capacity, mode=mode)
    for i, (env_id, regret, last_played) in enumerate(entries):
        result = memory.add(record(env_id, regret=regret, code=code_variant(i),
                                   last_played=last_played))
        assert result.status == "added"
    return memory


def test_code_hash_ignores_comments_docstrings_and_layout():
    reformatted = CODE_X.replace('    """Doc."""\n', "")
    reformatted = reformatted.replace("return f", "# note\n\n        return  f")
    assert M.code_hash(reformatted) == M.code_hash(CODE_X)
    assert M.code_hash(code_variant(4)) != M.code_hash(CODE_X)
    with pytest.raises(ValueError, match="does not parse"):
        M.code_hash("class Broken(:\n")


def test_fifo_evicts_oldest():
    memory = make_memory("fifo", [("a", 0.9, None), ("b", 0.1, None), ("c", 0.5, None)])
    result = memory.add(record("d", regret=0.2, code=CODE_Y))
    assert result == M.AddResult("added", "a")
    assert [r.id for r in memory.records] == ["b", "c", "d"]


def test_plr_evicts_lowest_priority_and_rejects_low_regret():
    memory = make_memory("plr", [("a", 0.9, None), ("b", 0.1, None), ("c", 0.5, None)])
    # nothing stale: P is the rank distribution 1 : 1/3 : 1/2 -> b has the lowest priority
    np.testing.assert_allclose(memory.priorities(), np.array([6, 2, 3]) / 11)
    assert memory.add(record("d", regret=0.2, code=CODE_Y)) == M.AddResult("added", "b")
    assert [r.id for r in memory.records] == ["a", "c", "d"]
    # now d (0.2) is lowest; a new env with lower regret is not stored
    assert memory.add(record("e", regret=0.05)).status == "rejected"
    assert len(memory) == 3


def test_plr_priorities_golden_with_staleness():
    # ranks -> P_S = [6, 2, 3]/11; ages [1, 5, 3] -> P_C = [1, 5, 3]/9
    p = M.plr_priorities([0.9, 0.1, 0.5], [4, 0, 2], now=5, staleness_coef=0.3)
    expected = 0.7 * np.array([6, 2, 3]) / 11 + 0.3 * np.array([1, 5, 3]) / 9
    np.testing.assert_allclose(p, expected)
    assert p.sum() == pytest.approx(1.0)
    assert int(np.argmin(p)) == 2  # the stale low-regret env outranks the fresher one
    sharp = M.rank_priorities([0.9, 0.1, 0.5], temperature=0.5)
    np.testing.assert_allclose(sharp, np.array([1, 1 / 9, 1 / 4]) / (1 + 1 / 9 + 1 / 4))


def test_plr_eviction_uses_staleness():
    memory = M.EnvMemory(capacity=3, mode="plr")
    for i, (env_id, regret, played) in enumerate([("a", 0.9, 4), ("b", 0.1, 0), ("c", 0.5, 2)]):
        memory.add(record(env_id, regret=regret, code=code_variant(i), last_played=played))
    memory.current_cycle = 5
    assert memory.add(record("d", regret=0.6, cycle=5, code=CODE_Y)).evicted_id == "c"


def test_duplicate_refused():
    memory = M.EnvMemory()
    assert memory.add(record("a", code=CODE_X)).status == "added"
    commented = "# a copy\n" + CODE_X
    assert memory.add(record("b", code=commented)).status == "duplicate"
    assert len(memory) == 1
    with pytest.raises(ValueError, match="already holds"):
        memory.add(record("a", code=CODE_Y))


def _retrieval_memory():
    memory = M.EnvMemory(capacity=50)
    for i in range(12):  # in band, regret i/100
        memory.add(record(f"good{i}", regret=i / 100, win_rate=0.5, code=code_variant(i)))
    memory.add(record("other_skill", regret=1.0, win_rate=0.5, skill="B", code=code_variant(50)))
    memory.add(record("easy", regret=0.9, win_rate=0.97, code=code_variant(51)))
    memory.add(record("hard", regret=0.9, win_rate=0.05, code=code_variant(52)))
    memory.add(record("edge", regret=0.9, win_rate=0.9, code=code_variant(53)))  # neither
    memory.add(M.new_record("unplayed", "A", code_variant(54), cycle=0))
    return memory


def test_retrieval_with_seeded_rng():
    memory = _retrieval_memory()
    first = memory.retrieve("A", np.random.default_rng(7))
    again = memory.retrieve("A", np.random.default_rng(7))
    assert [r.id for r in first.positives] == [r.id for r in again.positives]
    assert [r.id for r in first.negatives] == [r.id for r in again.negatives]
    seen_positive, seen_negative = set(), set()
    for seed in range(200):
        examples = memory.retrieve("A", np.random.default_rng(seed))
        ids = [r.id for r in examples.positives]
        assert len(ids) == 2 and len(set(ids)) == 2
        seen_positive.update(ids)
        assert len(examples.negatives) == 1
        seen_negative.add(examples.negatives[0].id)
    # pool = top max(3*2, 10) = 10 by regret: good0 and good1 are never drawn
    assert seen_positive == {f"good{i}" for i in range(2, 12)}
    assert seen_negative == {"easy", "hard"}


def test_retrieval_small_pools_and_other_skill():
    memory = _retrieval_memory()
    only_b = memory.retrieve("B", np.random.default_rng(0))
    assert [r.id for r in only_b.positives] == ["other_skill"] and only_b.negatives == []
    assert memory.retrieve("C", np.random.default_rng(0)) == M.MemoryExamples([], [])


def test_sample_for_replay_marks_records_played():
    memory = make_memory("plr", [("a", 0.9, None), ("b", 0.1, None), ("c", 0.5, None)])
    drawn = memory.sample_for_replay(2, np.random.default_rng(0), cycle=4)
    assert len(drawn) == 2 and len({r.id for r, _ in drawn}) == 2
    assert all(r.last_played == 4 for r, _ in drawn)
    by_id = {r.id: r for r in memory.records}
    assert all(by_id[r.id].last_played == 4 for r, _ in drawn)
    assert memory.current_cycle == 4
    assert all(0 < p < 1 for _, p in drawn)
    assert len(memory.sample_for_replay(10, np.random.default_rng(0), cycle=5)) == 3
    assert M.EnvMemory().sample_for_replay(2, np.random.default_rng(0)) == []
    (record_, _), = memory.sample_for_replay(1, np.random.default_rng(0))
    assert record_.last_played == 5  # defaults to the current cycle


def test_novelty_report():
    memory = M.EnvMemory()
    memory.add(record("x", code=CODE_X))
    report = memory.novelty([
        "# reformatted\n" + CODE_X,  # exact duplicate of memory
        code_variant(7),  # constants changed: near duplicate
        CODE_Y,  # new
        CODE_Y,  # duplicate of the batch's own earlier env
    ])
    assert report.n_envs == 4
    assert report.n_exact_duplicates == 2
    assert report.n_novel == 1
    assert report.novelty == 0.25
    assert report.max_similarity[0] == 1.0 and report.max_similarity[1] == 1.0
    assert report.max_similarity[2] < 0.5
    assert len(memory) == 1  # unchanged
    assert M.EnvMemory().novelty([]).novelty == 0.0


def test_seed_from():
    memory = M.EnvMemory()
    added = memory.seed_from([("counter", "A", CODE_X), ("maze", "B", CODE_Y),
                              ("counter_copy", "A", CODE_X)])
    assert added == 2
    assert [r.id for r in memory.records] == ["seed:counter", "seed:maze"]
    assert all(r.win_rate is None for r in memory.records)
    assert memory.retrieve("A", np.random.default_rng(0)) == M.MemoryExamples([], [])


def test_json_round_trip():
    """The memory restores exactly from the JSON of `to_dict` (as the checkpoint stores it)."""
    memory = _retrieval_memory()
    memory.sample_for_replay(3, np.random.default_rng(1), cycle=6)
    loaded = M.EnvMemory.from_dict(json.loads(json.dumps(memory.to_dict())))
    assert loaded.to_dict() == memory.to_dict()
    assert loaded.records == memory.records
    # the restored memory behaves exactly like the original
    a = memory.sample_for_replay(4, np.random.default_rng(3), cycle=7)
    b = loaded.sample_for_replay(4, np.random.default_rng(3), cycle=7)
    assert a == b
    assert memory.retrieve("A", np.random.default_rng(5)) == loaded.retrieve(
        "A", np.random.default_rng(5))


def test_bad_settings():
    with pytest.raises(ValueError, match="memory mode"):
        M.EnvMemory(mode="lifo")


def test_seed_environments_are_distinct_and_novel():
    """Calibration: the hand-written seeds are pairwise below the novelty threshold."""
    seeds = list_seed_envs()
    if not seeds:
        pytest.skip("no seed environments yet")
    memory = M.EnvMemory()
    assert memory.seed_from((e.name, e.skill, e.code) for e in seeds) == len(seeds)
    report = M.EnvMemory().novelty([e.code for e in seeds])
    assert report.n_novel == len(seeds), report.max_similarity


def test_contains_and_update_stats():
    memory = M.EnvMemory(mode="plr")
    memory.add(record("a", regret=0.1, win_rate=0.2, code=CODE_X))
    assert memory.contains_hash_of("# comment\n" + CODE_X)
    assert not memory.contains_hash_of(CODE_Y)
    updated = memory.update_stats("a", cycle=8, win_rate=0.6, regret=0.4, r_hint=0.9,
                                  r_nohint=0.5)
    assert memory.records == [updated]
    assert (updated.win_rate, updated.regret, updated.last_played) == (0.6, 0.4, 8)
    assert (updated.r_hint, updated.r_nohint, updated.cycle) == (0.9, 0.5, 0)
    assert memory.current_cycle == 8
    with pytest.raises(KeyError, match="no environment 'b'"):
        memory.update_stats("b", cycle=8, win_rate=0.5, regret=0.0)


@pytest.mark.parametrize("probabilities, weights", [
    ([0.5, 0.25, 0.25], [1.5, 0.75, 0.75]),  # golden: probability over the draws' mean
    ([0.2, 0.2], [1.0, 1.0]),
    ([], []),
])
def test_replay_weights_are_draw_probabilities_over_their_mean(probabilities, weights):
    assert M.replay_weights(probabilities) == pytest.approx(weights)
