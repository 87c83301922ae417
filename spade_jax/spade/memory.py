"""Environment memory: past environments with their play statistics (docs/DESIGN.md §4.8).

The memory feeds the Designer prompt (2 high-regret positives and 1 negative of the target
skill), refuses exact duplicates (same normalised AST), measures the novelty of each cycle's
environments, and picks environments to replay. It is saved in the checkpoint's host state
(``to_dict`` / ``from_dict``) and restores exactly.

Two eviction modes at capacity (200 by default):

* ``fifo`` (reference parity): the oldest record goes.
* ``plr``: prioritized level replay as in ``facebookresearch/minimax``
  (``src/minimax/util/rl/plr.py``, Jiang et al. 2021). The replay priority is
  ``P = (1 - rho) * P_rank(regret) + rho * P_staleness`` with ``P_rank ∝ (1/rank)^(1/T)``
  and ``P_staleness ∝ current_cycle - last_played``; a new environment replaces the record of
  lowest ``P`` when its regret is at least that record's regret, otherwise it is not stored.
"""

from __future__ import annotations

import ast
import dataclasses
import enum
import hashlib
import io
import tokenize
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from spade_jax.envs.lint import parse_source

MEMORY_FORMAT = "spade_jax.env_memory"
MEMORY_FORMAT_VERSION = 1


class MemoryMode(enum.StrEnum):
    """Which record leaves a full memory: the oldest (FIFO) or the lowest replay score (PLR)."""

    FIFO = "fifo"
    PLR = "plr"


POSITIVE_WIN_RANGE = (0.15, 0.85)
NEGATIVE_WIN_BOUNDS = (0.1, 0.9)
SHINGLE_SIZE = 3


def _strip_docstrings(tree: ast.AST) -> ast.AST:
    body_owners = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)
    for node in ast.walk(tree):
        if not isinstance(node, body_owners) or not node.body:
            continue
        first = node.body[0]
        if (
            isinstance(first, ast.Expr)
            and isinstance(first.value, ast.Constant)
            and isinstance(first.value.value, str)
        ):
            node.body = node.body[1:] or [ast.Pass()]
    return tree


def _normalised_tree(code: str) -> ast.AST:
    try:
        tree = parse_source(code)
    except SyntaxError as error:
        raise ValueError(f"environment code does not parse: {error}") from error
    return _strip_docstrings(tree)


def code_hash(code: str) -> str:
    """SHA-256 of ``ast.dump`` of the code without docstrings.

    Comments, blank lines, formatting and docstrings do not change the hash; any change to
    the program does. Raises ``ValueError`` for code that does not parse.
    """
    dump = ast.dump(_normalised_tree(code), annotate_fields=True, include_attributes=False)
    return hashlib.sha256(dump.encode("utf-8")).hexdigest()


def code_shingles(code: str, size: int = SHINGLE_SIZE) -> frozenset[tuple[str, ...]]:
    """Set of ``size``-grams of normalised tokens, the basis of the novelty similarity.

    Normalisation: docstrings and comments removed, layout canonicalised by ``ast.unparse``,
    every string literal replaced by ``<str>`` and every number by ``<num>``, so that a copy
    with renamed constants or reworded messages still looks like its original.
    """
    source = ast.unparse(_normalised_tree(code))
    skipped = {
        tokenize.NEWLINE, tokenize.NL, tokenize.INDENT, tokenize.DEDENT,
        tokenize.ENDMARKER, tokenize.COMMENT, tokenize.ENCODING,
    }
    # Python >= 3.12 splits f-strings into FSTRING_START ... FSTRING_END tokens.
    fstring_start = getattr(tokenize, "FSTRING_START", None)
    fstring_end = getattr(tokenize, "FSTRING_END", None)
    tokens: list[str] = []
    fstring_depth = 0
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == fstring_start:
            fstring_depth += 1
            if fstring_depth == 1:
                tokens.append("<str>")
        elif token.type == fstring_end:
            fstring_depth -= 1
        elif fstring_depth or token.type in skipped:
            continue
        elif token.type == tokenize.STRING:
            tokens.append("<str>")
        elif token.type == tokenize.NUMBER:
            tokens.append("<num>")
        else:
            tokens.append(token.string)
    if len(tokens) < size:
        return frozenset({tuple(tokens)})
    return frozenset(tuple(tokens[i : i + size]) for i in range(len(tokens) - size + 1))


def jaccard(a: frozenset, b: frozenset) -> float:
    """``|a ∩ b| / |a ∪ b|`` (1.0 for two empty sets)."""
    union = len(a | b)
    return 1.0 if union == 0 else len(a & b) / union


@dataclasses.dataclass(frozen=True)
class MemoryRecord:
    """One stored environment. ``win_rate`` is ``None`` for never-played (seed) records.

    ``cycle`` is the cycle it was generated in, ``last_played`` the last cycle it was played
    (staleness), ``doc_id`` the grounding document it came from, if any.
    """

    id: str
    code_hash: str
    skill: str
    code: str
    hint: str | None = None
    win_rate: float | None = None
    regret: float = 0.0
    r_hint: float | None = None
    r_nohint: float | None = None
    doc_id: str | None = None
    cycle: int = 0
    last_played: int = 0


def new_record(
    env_id: str,
    skill: str,
    code: str,
    *,
    cycle: int,
    hint: str | None = None,
    win_rate: float | None = None,
    regret: float = 0.0,
    r_hint: float | None = None,
    r_nohint: float | None = None,
    doc_id: str | None = None,
) -> MemoryRecord:
    """A `MemoryRecord` with its code hash computed and ``last_played = cycle``."""
    return MemoryRecord(
        id=env_id, code_hash=code_hash(code), skill=skill, code=code, hint=hint,
        win_rate=win_rate, regret=float(regret), r_hint=r_hint, r_nohint=r_nohint,
        doc_id=doc_id, cycle=int(cycle), last_played=int(cycle),
    )


def rank_priorities(scores: Sequence[float], temperature: float = 1.0) -> np.ndarray:
    """``(1/rank)^(1/T)``, normalised; rank 1 is the highest score, ties by position."""
    values = np.asarray(scores, dtype=np.float64)
    if values.size == 0:
        return values
    order = np.argsort(-values, kind="stable")
    ranks = np.empty(values.size, dtype=np.float64)
    ranks[order] = np.arange(1, values.size + 1)
    weights = (1.0 / ranks) ** (1.0 / temperature)
    return weights / weights.sum()


def staleness_priorities(last_played: Sequence[int], now: int) -> np.ndarray | None:
    """``(now - last_played) / sum``; ``None`` when nothing is stale."""
    ages = np.maximum(0, now - np.asarray(last_played, dtype=np.float64))
    total = ages.sum()
    return None if total == 0 else ages / total


def plr_priorities(
    regrets: Sequence[float],
    last_played: Sequence[int],
    now: int,
    staleness_coef: float = 0.3,
    temperature: float = 1.0,
) -> np.ndarray:
    """Replay distribution ``(1 - rho) * P_rank(regret) + rho * P_staleness``.

    When no record is stale the staleness term falls back to the rank term (minimax).
    """
    score_dist = rank_priorities(regrets, temperature)
    stale_dist = staleness_priorities(last_played, now)
    if stale_dist is None:
        stale_dist = score_dist
    return (1.0 - staleness_coef) * score_dist + staleness_coef * stale_dist


@dataclasses.dataclass(frozen=True)
class MemoryExamples:
    """Records retrieved for one Designer prompt."""

    positives: list[MemoryRecord]
    negatives: list[MemoryRecord]


class AddStatus(enum.StrEnum):
    """How `EnvMemory.add` treated a record: stored, already held (same code), or refused
    (PLR: a full memory whose lowest replay score beats the newcomer's)."""

    ADDED = "added"
    DUPLICATE = "duplicate"
    REJECTED = "rejected"


@dataclasses.dataclass(frozen=True)
class AddResult:
    """Outcome of `EnvMemory.add`: its status and the record it evicted, if any."""

    status: AddStatus
    evicted_id: str | None = None


@dataclasses.dataclass(frozen=True)
class NoveltyReport:
    """Novelty of a batch of new environments against memory and each other.

    An environment is novel when its code hash is new and the Jaccard similarity of its
    normalised token shingles (`code_shingles`) to every stored environment and to every
    earlier environment of the batch is below ``threshold``.
    """

    n_envs: int
    n_novel: int
    n_exact_duplicates: int
    max_similarity: list[float]
    threshold: float

    @property
    def novelty(self) -> float:
        """Share of novel environments (0 for an empty batch)."""
        return self.n_novel / self.n_envs if self.n_envs else 0.0


class EnvMemory:
    """Bounded store of `MemoryRecord`s in insertion order, with retrieval and replay."""

    def __init__(
        self,
        capacity: int = 200,
        mode: MemoryMode | str = MemoryMode.FIFO,
        staleness_coef: float = 0.3,
        temperature: float = 1.0,
    ) -> None:
        if mode not in tuple(MemoryMode):
            raise ValueError(f"memory mode {mode!r} is not one of {tuple(MemoryMode)}")
        if capacity < 1:
            raise ValueError(f"memory capacity must be >= 1, got {capacity}")
        if not 0.0 <= staleness_coef <= 1.0 or temperature <= 0:
            raise ValueError(
                f"need 0 <= staleness_coef <= 1 and temperature > 0, got "
                f"{staleness_coef}, {temperature}"
            )
        self.capacity = capacity
        self.mode = MemoryMode(mode)
        self.staleness_coef = staleness_coef
        self.temperature = temperature
        self.current_cycle = 0
        self._records: list[MemoryRecord] = []

    def __len__(self) -> int:
        return len(self._records)

    @property
    def records(self) -> list[MemoryRecord]:
        """A copy of the records, oldest first."""
        return list(self._records)

    def contains_hash_of(self, code: str) -> bool:
        """Whether an environment with the same normalised AST as ``code`` is stored."""
        hash_ = code_hash(code)
        return any(record.code_hash == hash_ for record in self._records)

    def update_stats(
        self,
        env_id: str,
        *,
        cycle: int,
        win_rate: float,
        regret: float,
        r_hint: float | None = None,
        r_nohint: float | None = None,
    ) -> MemoryRecord:
        """Refresh a stored environment with the statistics of a new play at ``cycle``.

        A replayed environment's score changes as the Agent learns (PLR updates scores of
        revisited levels in place); it also counts as played at ``cycle``.
        """
        for index, record in enumerate(self._records):
            if record.id == env_id:
                updated = dataclasses.replace(
                    record, win_rate=float(win_rate), regret=float(regret), r_hint=r_hint,
                    r_nohint=r_nohint, last_played=int(cycle),
                )
                self._records[index] = updated
                self.current_cycle = max(self.current_cycle, int(cycle))
                return updated
        raise KeyError(f"no environment {env_id!r} in memory")

    def priorities(self) -> np.ndarray:
        """PLR replay distribution over the records at ``current_cycle``."""
        return plr_priorities(
            [r.regret for r in self._records],
            [r.last_played for r in self._records],
            self.current_cycle,
            self.staleness_coef,
            self.temperature,
        )

    def add(self, record: MemoryRecord) -> AddResult:
        """Insert ``record`` unless its code hash is stored; evict per mode when full."""
        if any(r.id == record.id for r in self._records):
            raise ValueError(f"memory already holds a record with id {record.id!r}")
        if any(r.code_hash == record.code_hash for r in self._records):
            return AddResult(AddStatus.DUPLICATE)
        self.current_cycle = max(self.current_cycle, record.cycle)
        evicted: MemoryRecord | None = None
        if len(self._records) >= self.capacity:
            if self.mode == MemoryMode.FIFO:
                evicted = self._records[0]
            else:
                lowest = int(np.argmin(self.priorities()))
                if record.regret < self._records[lowest].regret:
                    return AddResult(AddStatus.REJECTED)
                evicted = self._records[lowest]
            self._records.remove(evicted)
        self._records.append(record)
        return AddResult(AddStatus.ADDED, None if evicted is None else evicted.id)

    def retrieve(
        self,
        skill: str,
        rng: np.random.Generator,
        n_positive: int = 2,
        n_negative: int = 1,
    ) -> MemoryExamples:
        """Few-shot examples for a Designer prompt of ``skill`` (reference retrieval).

        Positives: same skill, 0.15 <= win rate <= 0.85, ``n_positive`` drawn uniformly from
        the top ``max(3n, 10)`` by regret. Negatives: same skill, win rate > 0.9 or < 0.1.
        Never-played records are not retrieved.
        """
        played = [r for r in self._records if r.skill == skill and r.win_rate is not None]
        low, high = POSITIVE_WIN_RANGE
        in_band = [r for r in played if low <= r.win_rate <= high]
        in_band.sort(key=lambda r: r.regret, reverse=True)
        pool = in_band[: max(3 * n_positive, 10)]
        neg_low, neg_high = NEGATIVE_WIN_BOUNDS
        bad = [r for r in played if r.win_rate > neg_high or r.win_rate < neg_low]
        return MemoryExamples(
            positives=_sample_without_replacement(pool, n_positive, rng),
            negatives=_sample_without_replacement(bad, n_negative, rng),
        )

    def sample_for_replay(
        self, n: int, rng: np.random.Generator, cycle: int | None = None
    ) -> list[tuple[MemoryRecord, float]]:
        """Draw up to ``n`` distinct records by PLR priority for replay at ``cycle``.

        Returns ``(record, probability)`` pairs (the probability is the regret weight the
        Agent loss may use) and marks the drawn records as played at ``cycle`` (default: the
        memory's ``current_cycle``).
        """
        if n < 0:
            raise ValueError(f"replay count must be >= 0, got {n}")
        cycle = self.current_cycle if cycle is None else int(cycle)
        self.current_cycle = max(self.current_cycle, cycle)
        if not self._records or n == 0:
            return []
        probabilities = self.priorities()
        chosen = rng.choice(
            len(self._records), size=min(n, len(self._records)), replace=False, p=probabilities
        )
        drawn = []
        for index in chosen:
            record = dataclasses.replace(self._records[index], last_played=int(cycle))
            self._records[index] = record
            drawn.append((record, float(probabilities[index])))
        return drawn

    def novelty(self, codes: Iterable[str], threshold: float = 0.7) -> NoveltyReport:
        """`NoveltyReport` of new environment codes (does not modify the memory)."""
        stored_hashes = {r.code_hash for r in self._records}
        seen = [code_shingles(r.code) for r in self._records]
        max_similarity: list[float] = []
        n_novel = n_duplicates = 0
        for code in codes:
            hash_ = code_hash(code)
            shingles = code_shingles(code)
            similarity = max((jaccard(shingles, other) for other in seen), default=0.0)
            duplicate = hash_ in stored_hashes
            n_duplicates += duplicate
            n_novel += (not duplicate) and similarity < threshold
            max_similarity.append(similarity)
            stored_hashes.add(hash_)
            seen.append(shingles)
        return NoveltyReport(
            n_envs=len(max_similarity), n_novel=n_novel, n_exact_duplicates=n_duplicates,
            max_similarity=max_similarity, threshold=threshold,
        )

    def seed_from(self, seeds: Iterable[tuple[str, str, str]], cycle: int = 0) -> int:
        """Add never-played records from ``(name, skill, code)`` seed environments.

        Returns how many were added (duplicates are skipped). Seeds have no statistics, so
        they serve dedupe, novelty and replay but are not retrieved as prompt examples.
        """
        added = 0
        for name, skill, code in seeds:
            result = self.add(new_record(f"seed:{name}", skill, code, cycle=cycle))
            added += result.status is AddStatus.ADDED
        return added

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready state, loaded back exactly by `from_dict`."""
        return {
            "format": MEMORY_FORMAT,
            "version": MEMORY_FORMAT_VERSION,
            "capacity": self.capacity,
            "mode": self.mode,
            "staleness_coef": self.staleness_coef,
            "temperature": self.temperature,
            "current_cycle": self.current_cycle,
            "records": [dataclasses.asdict(r) for r in self._records],
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> EnvMemory:
        """Inverse of `to_dict`; raises ``ValueError`` / ``KeyError`` / ``TypeError`` if bad."""
        if data.get("format") != MEMORY_FORMAT or data.get("version") != MEMORY_FORMAT_VERSION:
            raise ValueError(
                f"not a version-{MEMORY_FORMAT_VERSION} {MEMORY_FORMAT} document "
                f"(format={data.get('format')!r}, version={data.get('version')!r})"
            )
        memory = cls(
            capacity=int(data["capacity"]),
            mode=data["mode"],
            staleness_coef=float(data["staleness_coef"]),
            temperature=float(data["temperature"]),
        )
        memory.current_cycle = int(data["current_cycle"])
        memory._records = [MemoryRecord(**record) for record in data["records"]]
        if len(memory._records) > memory.capacity:
            raise ValueError(f"{len(memory._records)} records exceed capacity {memory.capacity}")
        return memory


def _sample_without_replacement(
    items: Sequence[MemoryRecord], n: int, rng: np.random.Generator
) -> list[MemoryRecord]:
    if n <= 0 or not items:
        return []
    chosen = rng.choice(len(items), size=min(n, len(items)), replace=False)
    return [items[int(i)] for i in chosen]


def replay_weights(probabilities: Sequence[float]) -> list[float]:
    """The Agent-loss weight of each memory replay: its PLR draw probability over the mean of
    the cycle's draws, so that replays weigh 1 on average and the likelier draws (higher
    regret, staler) weigh more."""
    mean = float(np.mean(probabilities)) if len(probabilities) else 0.0
    return [float(p) / mean for p in probabilities]
