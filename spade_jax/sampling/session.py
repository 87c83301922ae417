"""A batch of conversations in one KV cache, driven from the host: prefill, observation
appends, segmented decode turns, per-row capacity, and the training arrays of what was sampled.

The device work is `programs`' jitted functions, compiled by the `Sampler` that owns the
session; `spade_jax/sampling/sampler.py` describes the cache layout and the row conventions.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from spade_jax.distributed import to_host
from spade_jax.models.attention import DECODE_QUERIES
from spade_jax.sampling.programs import STOP_ID_SLOTS, bucket
from spade_jax.seeding import check_seed

if TYPE_CHECKING:
    from spade_jax.sampling.sampler import Sampler

_MIN_WINDOW = 64  # smallest cache window: fewer programs, and attention over 64 slots is cheap
# A decode segment's window holds at least this many more steps when needed: small enough
# that the window tracks the longest row (attention reads the whole window every step),
# large enough that a segment amortises its host round trip.
_SEGMENT_MIN_STEPS = 32
# Tokens per row and step from which a decode segment feeds its drafts: a step with 4
# drafts computes five queries a row, which on a CPU costs 2.1-2.8x a one-token step at 8-64
# rows (docs/performance.md); a memory-bound accelerator would pay less (not measured)
DRAFTS_PAY_AT = 2.4
# While drafts are looked up, a segment ends after this many steps to weigh them again
DRAFT_CHECK_STEPS = 32
# The fewest rows a decode computes once finished rows are dropped from it (each row count is
# a program to compile; below this a step costs about the same)
MIN_DECODE_ROWS = 4


def check_draft_tokens(draft_tokens: int) -> int:
    """`draft_tokens` as an int, or a ValueError: a step's pending token and its drafts are
    one query block of at most `DECODE_QUERIES`."""
    if not 0 <= int(draft_tokens) < DECODE_QUERIES:
        raise ValueError(f"draft_tokens={draft_tokens!r}: use 0 (no drafts) to "
                         f"{DECODE_QUERIES - 1}")
    return int(draft_tokens)


class CacheFullError(ValueError):
    """An append needs more cache slots than the session has left."""


class FinishReason(enum.StrEnum):
    """Why a row stopped generating: a stop token, its token budget, or its own cache being
    full (including a prompt longer than the capacity)."""

    STOP = "stop"
    LENGTH = "length"
    CONTEXT_FULL = "context_full"


@dataclasses.dataclass
class TurnOutput:
    """What one row generated in one `Session.decode` call."""

    tokens: list[int]
    logprobs: list[float]  # raw policy log-softmax (temperature 1) of the sampled token
    sampling_logprobs: list[float]  # under the distribution actually sampled from
    finish_reason: FinishReason

    @property
    def stopped(self) -> bool:
        """Whether the row ended with a stop token (its turn is complete)."""
        return self.finish_reason is FinishReason.STOP


@dataclasses.dataclass
class Turn:
    """A decode in progress (`Session.begin_turn`): per row its output so far, the tokens it
    may still sample, whether it still runs, and the sampling settings as program arguments."""

    outputs: list[TurnOutput | None]
    remaining: np.ndarray
    running: np.ndarray
    settings: tuple


class Session:
    """A batch of conversations living in one KV cache; the host-facing multi-turn API.

        session = sampler.start(prompt_ids, capacity=4096)
        turn = session.decode(max_new_tokens=256, temperature=0.7, stop_token_ids=[eos])
        session.append([obs_ids_or_None_per_row])       # observations, any lengths
        turn = session.decode(max_new_tokens=256, active=still_playing)
        batch = session.training_arrays()                # tokens, loss_mask, policy_logp, ...

    Per row the session keeps the full token sequence, a loss mask (1 on sampled tokens only)
    and the log-probabilities of the sampled tokens, aligned with the tokens. Each row holds up
    to `capacity` tokens of its own (`free_slots`); a prompt longer than that is refused for its
    row alone (`refused`: it decodes nothing, finish reason 'context_full').
    """

    def __init__(self, sampler: Sampler, prompts: Sequence[Sequence[int]], capacity: int,
                 draft_tokens: int = 0):
        if not prompts or any(len(p) == 0 for p in prompts):
            raise ValueError("every prompt needs at least one token")
        if int(capacity) < 1:
            raise ValueError(f"capacity={capacity!r}: a session needs at least one slot per row")
        self.sampler = sampler
        self.draft_tokens = check_draft_tokens(draft_tokens)
        # tokens per row and step that drafts gave or would give (`_drafts_pay`); until a
        # segment measured it, drafts are looked up but not fed
        self.draft_yield = 1.0
        self.num_rows = len(prompts)
        multiple = sampler.batch_multiple
        self.batch = -(-self.num_rows // multiple) * multiple
        self.slots = int(capacity)
        self.lengths = np.zeros((self.batch,), np.int32)  # tokens in each row's cache
        self.refused = np.zeros((self.num_rows,), bool)
        self.key_ids = np.arange(self.batch, dtype=np.int32)  # row id in the sampling keys
        self.sequences: list[list[int]] = [[] for _ in range(self.num_rows)]
        self.loss_masks: list[list[int]] = [[] for _ in range(self.num_rows)]
        self.logprobs: list[list[float]] = [[] for _ in range(self.num_rows)]
        self.sampling_logprobs: list[list[float]] = [[] for _ in range(self.num_rows)]
        self.cache = None
        # the lookups' histories on the host: [batch + 1, window] tokens by slot (row `batch`:
        # padding), rows filled from `sequences` up to `history_filled` tokens
        self.history = np.zeros((self.batch + 1, 0), np.int32)
        self.history_filled = np.zeros((self.num_rows,), np.int64)
        # decode-loop iterations so far: where a step costs about the same for any row count
        # (a memory-bound accelerator), the decode's time is proportional to them
        self.decode_steps = 0
        self.restart({r: p for r, p in enumerate(prompts)})

    def restart(self, prompts: dict[int, Sequence[int]]) -> None:
        """Replace rows by new conversations {row: prompt} and prefill them (those rows only).

        A prompt that does not leave room for one generated token (longer than the capacity)
        marks its row `refused` instead of failing the batch.
        """
        blocks = {}
        for r, prompt in prompts.items():
            prompt = list(map(int, prompt))
            if not prompt:
                raise ValueError(f"row {r}: every prompt needs at least one token")
            self.sequences[r] = prompt
            self.loss_masks[r] = [0] * len(prompt)
            self.logprobs[r] = [0.0] * len(prompt)
            self.sampling_logprobs[r] = [0.0] * len(prompt)
            self.lengths[r] = 0
            self.history_filled[r] = 0
            self.refused[r] = len(prompt) > self.slots
            if not self.refused[r]:
                blocks[r] = prompt[:-1]
        self._extend(blocks)

    @property
    def window(self) -> int:
        """Slots the cache arrays currently hold (a bucket; grows on demand)."""
        return 0 if self.cache is None else self.sampler.kv_layout.n_slots(self.cache[0][1])

    def _ensure_window(self, needed: int) -> None:
        """Grow the cache arrays so that slots [0, needed) exist."""
        if needed <= self.window:
            return
        window = bucket(needed, _MIN_WINDOW)
        if self.cache is None:
            self.cache, _ = self.sampler.new_cache(self.batch, window)
            return
        # layer by layer, each old layer freed before the next grows: the peak is the new
        # cache plus one old layer, not both caches whole
        grow = self.sampler.program("grow_layer", self.batch, self.window, new_window=window)
        for layer, (k, v) in enumerate(self.cache):
            self.cache[layer] = None
            self.cache[layer] = grow(k, v)
            del k, v

    @property
    def free_slots(self) -> np.ndarray:
        """[num_rows] tokens each row's cache can still take (0 for a refused row)."""
        free = self.slots - self.lengths[: self.num_rows]
        return np.where(self.refused, 0, free)

    def _extend(self, blocks: dict[int, list[int]]) -> None:
        """Write `blocks[r]` after row r's cached tokens, each row at its own position, in
        pieces of at most `Sampler.extend_width` tokens per row (chunked prefill). Where the
        cache's batch is not split over devices, rows whose blocks fall in the same length
        bucket are written together, apart from the others: a short prompt is not padded to
        the longest."""
        groups: dict[int, dict[int, list[int]]] = {}
        for r, block in blocks.items():
            if block:
                key = bucket(len(block)) if self.sampler.batch_multiple == 1 else 0
                groups.setdefault(key, {})[r] = block
        chunk = self.sampler.extend_width(self.batch)
        for group in groups.values():
            for start in range(0, max(len(b) for b in group.values()), chunk):
                self._extend_piece({r: b[start:start + chunk] for r, b in group.items()
                                    if len(b) > start})

    def _extend_piece(self, blocks: dict[int, list[int]]) -> None:
        """Write the non-empty `blocks[r]` after row r's cached tokens in one extend call.

        The rows with tokens are written in one bucketed block: all of the batch, or (where the
        cache's batch is not split over devices) only those rows, padded to a bucketed count.
        """
        longest = max(len(b) for b in blocks.values())
        width = bucket(longest)
        n_rows = bucket(len(blocks), 1)
        subset = self._row_subset(n_rows)
        # each row's block goes to its own next slots (a block's padding past the window is
        # dropped)
        self._ensure_window(max(int(self.lengths[r]) + len(b) for r, b in blocks.items()))
        rows = np.array(sorted(blocks), np.int32) if subset else np.arange(self.batch)
        if subset:
            rows = np.concatenate([rows, np.full((n_rows - len(rows),), self.batch, np.int32)])
        tokens = np.zeros((len(rows), width), np.int32)
        mask = np.zeros((len(rows), width), bool)
        positions = np.zeros((len(rows), width), np.int32)
        for i, r in enumerate(rows):
            block = blocks.get(int(r))
            if block:
                n = len(block)
                tokens[i, :n] = block
                mask[i, :n] = True
                # a row's rotary position counts its tokens: the block follows its cached ones
                positions[i, :n] = self.lengths[r] + np.arange(n)
        lengths = np.append(self.lengths, 0)[rows]  # padding rows: empty
        if subset:
            program = self.sampler.program("extend_rows", self.batch, self.window,
                                            rows=len(rows), width=width)
            self.cache = program(self.sampler.state, self.sampler.fused_weights, self.cache,
                                 *map(self.sampler.put_replicated,
                                     (lengths, rows, tokens, mask, positions)))
        else:
            program = self.sampler.program("extend", self.batch, self.window, width=width)
            self.cache = program(
                self.sampler.state, self.sampler.fused_weights, self.cache,
                *map(self.sampler.put_batch, (lengths, tokens, mask, positions)))
        for r, block in blocks.items():
            self.lengths[r] += len(block)

    def append(self, observations: Sequence[Sequence[int] | None]) -> None:
        """Append tokens (e.g. an environment observation) to rows; None or [] leaves a row as is.

        Appended tokens are context, not samples: loss mask 0, log-prob 0. Raises
        CacheFullError, naming the rows and changing nothing, when an observation does not fit
        in its row's free slots.
        """
        if len(observations) != self.num_rows:
            raise ValueError(f"got {len(observations)} observations for {self.num_rows} rows")
        observations = [list(map(int, o or ())) for o in observations]
        free = self.free_slots
        too_long = [r for r, obs in enumerate(observations) if len(obs) > free[r]]
        if too_long:
            raise CacheFullError(
                "observations of rows " + ", ".join(
                    f"{r} ({len(observations[r])} tokens, {free[r]} of {self.slots} slots "
                    "left)" for r in too_long)
                + " do not fit; start the session with a larger capacity")
        blocks = {}
        for r, obs in enumerate(observations):
            if obs:
                blocks[r] = self.sequences[r][-1:] + obs[:-1]
                self.sequences[r] += obs
                self.loss_masks[r] += [0] * len(obs)
                self.logprobs[r] += [0.0] * len(obs)
                self.sampling_logprobs[r] += [0.0] * len(obs)
        self._extend(blocks)

    def decode(
        self,
        max_new_tokens: int | Sequence[int],
        *,
        temperature: float = 0.0,
        top_k: int = 0,
        top_p: float = 1.0,
        stop_token_ids: Sequence[int] = (),
        seed: int = 0,
        active: Sequence[bool] | None = None,
    ) -> list[TurnOutput | None]:
        """Sample up to `max_new_tokens` (an int or one per row) for every active row.

        A row stops at its first stop token (kept, with loss mask 1: the model must learn to
        end its turn), at its limit ('length'), or when its own cache is full
        ('context_full'). Inactive rows get None and are untouched. Sampling with a given
        seed is reproducible: each token's key derives from (seed, row, position in the
        conversation). `seed` is in [0, 2**31) (`spade_jax.seeding`); another value is a
        ValueError naming it.
        """
        limits = np.broadcast_to(np.asarray(max_new_tokens, np.int32), (self.num_rows,)).copy()
        if active is not None:
            limits[~np.asarray(active, bool)] = 0
        turn = self.begin_turn(limits, temperature=temperature, top_k=top_k, top_p=top_p,
                               stop_token_ids=stop_token_ids, seed=seed)
        while turn.running.any():
            self.decode_segment(turn)
        return turn.outputs

    def begin_turn(self, limits: np.ndarray, *, temperature: float = 0.0, top_k: int = 0,
                   top_p: float = 1.0, stop_token_ids: Sequence[int] = (),
                   seed: int = 0) -> Turn:
        """A turn of the rows with `limits[r]` > 0 tokens to sample, to run with
        `decode_segment` (what `decode` does, and what lets an engine refill rows between
        segments)."""
        seed = check_seed(seed)
        limits = np.asarray(limits, np.int32)
        if len(stop_token_ids) > STOP_ID_SLOTS:
            raise ValueError(f"at most {STOP_ID_SLOTS} stop token ids are supported")
        stop_ids = np.full((STOP_ID_SLOTS,), -1, np.int32)
        stop_ids[: len(stop_token_ids)] = list(stop_token_ids)
        settings = (stop_ids, np.float32(temperature), np.int32(top_k), np.float32(top_p),
                    np.uint32(seed))
        turn = Turn([None] * self.num_rows, np.zeros((self.num_rows,), np.int32),
                    np.zeros((self.num_rows,), bool), settings)
        self.start_rows(turn, {int(r): int(limits[r]) for r in np.flatnonzero(limits > 0)})
        return turn

    def start_rows(self, turn: Turn, limits: dict[int, int]) -> None:
        """Start a new turn in `turn` for the rows {row: max_new_tokens} (others keep theirs).

        A row with fewer free slots than its limit samples until its cache is full
        ('context_full', unless it stops first); a full row ends at once with no token.
        """
        free = self.free_slots
        for r, limit in limits.items():
            reason = FinishReason.CONTEXT_FULL if free[r] < limit else FinishReason.LENGTH
            turn.outputs[r] = TurnOutput([], [], [], reason)
            turn.remaining[r] = min(limit, free[r])
            turn.running[r] = turn.remaining[r] > 0

    def _row_subset(self, n_rows: int) -> bool:
        """Whether a program may compute `n_rows` of the cache's rows apart: only where its
        batch is not split over devices, and for at most half of them (a decode's subset is a
        copy of its rows, `plan.kv_row_copy`; an extend's indexes them in the cache)."""
        return self.sampler.batch_multiple == 1 and 2 * n_rows <= self.batch

    def _program_rows(self, n_running: int) -> int:
        """Rows the next decode segment computes: the running ones padded to a bucket (2^i or
        1.5 * 2^i, at least `MIN_DECODE_ROWS`) where they may run apart (`_row_subset`), else
        the whole batch."""
        rows = bucket(n_running, MIN_DECODE_ROWS)
        return rows if self._row_subset(rows) else self.batch

    def _next_smaller_program(self, rows: int) -> int:
        """The largest row bucket below `rows` that a segment may compute apart, or 0."""
        smaller, candidate = 0, MIN_DECODE_ROWS
        while candidate < rows:
            smaller = candidate if self._row_subset(candidate) else smaller
            candidate = bucket(candidate + 1, MIN_DECODE_ROWS)
        return smaller

    def decode_segment(self, turn: Turn, exit_after_finished: int | None = None,
                       max_steps: int | None = None) -> None:
        """One while-loop decode over the current window for `turn`'s running rows, ending
        early once `exit_after_finished` of them finished, once so many finished that the
        next segment can run on a smaller row bucket (`_program_rows`), or after `max_steps`
        steps; updates `turn` and the rows."""
        running = turn.running
        if not running.any():
            return
        longest = int(self.lengths[: self.num_rows][running].max())
        want = int(turn.remaining[running].max())
        # Grow the window to the bucket that holds the next few steps; the segment runs until
        # that window is full, so segments lengthen with the (geometric) buckets while the
        # window, which attention reads whole every step, stays near the longest row.
        self._ensure_window(max(int(self.lengths.max()),
                                longest + min(want, _SEGMENT_MIN_STEPS)))
        n_running = int(running.sum())
        program_rows = self._program_rows(n_running)
        exit_after = self.batch + 1 if exit_after_finished is None else exit_after_finished
        # pause once the rows still running fit in the next smaller program
        smaller = self._next_smaller_program(program_rows)
        if smaller:
            exit_after = min(exit_after, n_running - smaller)
        # turns look drafts up, and feed them while they pay (`_drafts_pay`)
        lookup = self.draft_tokens > 0
        drafts = self.draft_tokens if lookup and self._drafts_pay() else 0
        if lookup:  # weigh the drafts again soon
            max_steps = min(max_steps or DRAFT_CHECK_STEPS, DRAFT_CHECK_STEPS)
        if program_rows < self.batch:
            rows = np.concatenate([np.flatnonzero(running), np.full(
                (program_rows - n_running,), self.batch)]).astype(np.int32)
            put = self.sampler.put_replicated
            program = self.sampler.program("decode_rows", self.batch, self.window,
                                           rows=program_rows, draft_tokens=drafts,
                                           lookup=lookup)
            head = (put(rows),)
        else:
            rows = np.arange(self.batch, dtype=np.int32)
            put = self.sampler.put_batch
            program = self.sampler.program("decode", self.batch, self.window,
                                           draft_tokens=drafts, lookup=lookup)
            head = ()
        # per row, with a zero row at index `batch` for the padding rows
        per_row = lambda values: put(np.append(  # noqa: E731
            np.asarray(values, np.int32), np.zeros((self.batch + 1 - len(values),), np.int32)
        )[rows])
        limits = np.where(running, turn.remaining, 0)
        self.cache, buffers, n_gen, stopped, steps, record = program(
            self.sampler.state, self.sampler.fused_weights, self.cache, *head,
            per_row(self.lengths), per_row([seq[-1] for seq in self.sequences]),
            per_row([len(seq) - 1 for seq in self.sequences]), per_row(limits),
            np.int32(min(self.window - longest, max_steps or self.window)),
            np.int32(exit_after), *turn.settings,
            per_row(self.key_ids), *([put(self._histories(rows))] if lookup else []))
        n_gen, stopped = to_host(n_gen), to_host(stopped)
        self.decode_steps += int(to_host(steps))
        row_steps, successes = map(int, to_host(record))
        if lookup and row_steps:
            self.draft_yield = (1 + successes / row_steps if drafts else sum(
                (successes / row_steps) ** i for i in range(self.draft_tokens + 1)))
        buffers = tuple(to_host(b) for b in buffers)
        for i, r in enumerate(rows):
            if r >= self.num_rows or not running[r]:
                continue
            k = int(n_gen[i])
            tokens, logps, sampling_logps = (b[i, :k].tolist() for b in buffers)
            out = turn.outputs[r]
            out.tokens += tokens
            out.logprobs += logps
            out.sampling_logprobs += sampling_logps
            self.sequences[r] += tokens
            self.loss_masks[r] += [1] * k
            self.logprobs[r] += logps
            self.sampling_logprobs[r] += sampling_logps
            self.lengths[r] += k
            turn.remaining[r] -= k
            if stopped[i]:
                out.finish_reason = FinishReason.STOP
            running[r] = not stopped[i] and turn.remaining[r] > 0

    def _drafts_pay(self) -> bool:
        """Whether the next segment feeds drafts: when the last one took (with drafts)
        or would have taken (one token a step, its first drafts' success rate h extrapolated
        as 1 + h + ... + h^k) at least `DRAFTS_PAY_AT` tokens per row and step."""
        return self.draft_yield >= DRAFTS_PAY_AT

    def _histories(self, rows: np.ndarray) -> np.ndarray:
        """[len(rows), window] the tokens of `rows` by cache slot, pending token included
        (past them zeros, or a restarted row's old tokens, which the lookup never reads; zeros
        for padding rows, index `batch`): the drafts' lookup. Only the tokens added since the
        last call are copied from `sequences`."""
        if self.history.shape[1] < self.window:
            self.history = np.pad(self.history,
                                  ((0, 0), (0, self.window - self.history.shape[1])))
        for r in rows:
            if r < self.num_rows:
                end = min(len(self.sequences[r]), self.window)
                start = self.history_filled[r]
                if start < end:
                    self.history[r, start:end] = self.sequences[r][start:end]
                    self.history_filled[r] = end
        return self.history[rows]

    def training_arrays(self, rows: Sequence[int] | None = None,
                        length: int | None = None) -> dict[str, np.ndarray]:
        """Right-padded arrays of the chosen rows in the train step's batch format.

        tokens [R, T] int32, mask [R, T] (real tokens), loss_mask [R, T] (sampled tokens),
        policy_logp (temperature 1) and behaviour_logp (as sampled) [R, T] (log-prob of
        tokens[t] given tokens[<t]; 0 off the loss mask). `length` defaults to the longest row.
        """
        rows = list(range(self.num_rows)) if rows is None else list(rows)
        length = length or max(len(self.sequences[r]) for r in rows)
        out = {
            "tokens": np.zeros((len(rows), length), np.int32),
            "mask": np.zeros((len(rows), length), bool),
            "loss_mask": np.zeros((len(rows), length), np.float32),
            "policy_logp": np.zeros((len(rows), length), np.float32),
            "behaviour_logp": np.zeros((len(rows), length), np.float32),
        }
        for i, r in enumerate(rows):
            n = len(self.sequences[r])
            if n > length:
                raise ValueError(f"row {r} has {n} tokens, more than length={length}")
            out["tokens"][i, :n] = self.sequences[r]
            out["mask"][i, :n] = True
            out["loss_mask"][i, :n] = self.loss_masks[r]
            out["policy_logp"][i, :n] = self.logprobs[r]
            out["behaviour_logp"][i, :n] = self.sampling_logprobs[r]
        return out
