"""Training samples of both roles and their assembly into one padded policy-gradient batch.

A sample is one token sequence (prompt + everything after it) with a mask over the tokens the
policy generated, the log-probabilities the sampler recorded for them (the behaviour policy of
the train step's TIS weight; PPO's old_logp comes from the train step's own forward), and one
scalar advantage broadcast to every generated token. Designer samples go first in the batch,
so that trimming a batch to its size never drops every Designer sample (the reference's
ordering).
"""

from __future__ import annotations

import dataclasses
import enum

import numpy as np


class Role(enum.StrEnum):
    """Which role generated a sample: the Designer (an environment) or the Agent (a play)."""

    DESIGNER = "designer"
    AGENT = "agent"


@dataclasses.dataclass
class TrainSample:
    """One sequence to train on. `loss_mask[i]` marks generated tokens; `behaviour_logp`
    aligns: the sampler's raw (temperature 1) log-prob of each generated token."""

    tokens: np.ndarray  # int32 [n]
    loss_mask: np.ndarray  # bool [n]
    behaviour_logp: np.ndarray  # float32 [n], 0 where loss_mask is False
    advantage: float
    role: Role  # a Role's value is accepted too (e.g. read back from a checkpoint)
    weight: float = 1.0  # e.g. replay priority weight of an Agent sample

    def __post_init__(self):
        if self.role not in tuple(Role):
            raise ValueError(f"role {self.role!r} is not one of {tuple(r.value for r in Role)}")
        self.role = Role(self.role)
        n = len(self.tokens)
        if len(self.loss_mask) != n or len(self.behaviour_logp) != n:
            raise ValueError(
                f"tokens ({n}), loss_mask ({len(self.loss_mask)}) and behaviour_logp "
                f"({len(self.behaviour_logp)}) must have the same length"
            )

    def to_json(self) -> dict:
        """Plain JSON (for checkpoints of delayed Designer samples)."""
        return {"tokens": self.tokens.tolist(), "loss_mask": self.loss_mask.tolist(),
                "behaviour_logp": self.behaviour_logp.tolist(), "advantage": self.advantage,
                "role": self.role, "weight": self.weight}

    @classmethod
    def from_json(cls, data: dict) -> TrainSample:
        """The inverse of `to_json`; also reads checkpoints written before the sampler's
        log-probs were renamed from old_logp to behaviour_logp."""
        logp = data["behaviour_logp"] if "behaviour_logp" in data else data["old_logp"]
        return cls(np.asarray(data["tokens"], np.int32), np.asarray(data["loss_mask"], bool),
                   np.asarray(logp, np.float32), float(data["advantage"]),
                   data["role"], float(data["weight"]))


def order_for_training(
    samples: list[TrainSample], max_samples: int | None = None
) -> list[TrainSample]:
    """Designer samples first, then Agent samples, trimmed to `max_samples`."""
    ordered = [s for s in samples if s.role is Role.DESIGNER] + [
        s for s in samples if s.role is Role.AGENT
    ]
    return ordered[:max_samples] if max_samples is not None else ordered


def plays_to_fill(n_envs: int, plays_per_env: int, batch_size: int) -> int:
    """No-hint plays of each of the `n_envs` environments of a cycle: `plays_per_env`, or as
    many as fill `batch_size` when fewer environments are played (reference orchestrator
    Stage 4, `ceil(global_batch_size / games)`: a pool short of valid games plays each more)."""
    if n_envs < 1 or batch_size < 1:
        return plays_per_env
    return max(plays_per_env, -(-batch_size // n_envs))


def fill_indices(n: int, target: int) -> list[int]:
    """0..n-1, then those indices again round-robin until there are `target` (reference Stage 7
    `upsample_trajectories`, which duplicates Agent samples to fill the batch); none when n is
    0, and just 0..n-1 when n already reaches `target`."""
    if n < 1:
        return []
    return list(range(n)) + [i % n for i in range(max(0, target - n))]


def drop_zero_advantage(
    samples: list[TrainSample], max_len: int | None = None
) -> tuple[list[TrainSample], int, int]:
    """(samples worth computing, generated tokens and samples of those that are not).

    A sample whose advantage (times its weight) is 0 has exactly zero PPO loss and gradient
    when there is no KL term; it only has to count in the loss's denominator (the train step's
    `skipped_tokens`, over its first `max_len` tokens as trained, and `skipped_samples`: those
    with a generated token there). One sample is always kept so
    the step has a batch (the optimizer step still runs: AdamW's moments and weight decay move
    on zero gradients too).
    """
    keep = [s.advantage * s.weight != 0 for s in samples]
    if samples and not any(keep):
        keep[min(range(len(samples)), key=lambda i: len(samples[i].tokens))] = True
    dropped = [s for s, kept in zip(samples, keep, strict=True) if not kept]
    return ([s for s, kept in zip(samples, keep, strict=True) if kept],
            sum(int(s.loss_mask[:max_len].sum()) for s in dropped),
            sum(bool(s.loss_mask[:max_len].any()) for s in dropped))


def bucket_length(n: int, minimum: int = 64) -> int:
    """Round a sequence length up to a power of two (few distinct shapes, few compiles)."""
    length = minimum
    while length < n:
        length *= 2
    return length


def length_groups(samples: list[TrainSample], max_len: int | None = None
                  ) -> list[list[TrainSample]]:
    """Samples grouped by their bucketed (and `max_len`-capped) length, longest group first.

    Each group is padded to its own length, so one 3k-token Designer sample does not pad every
    short Agent episode to 4k tokens; the train step accumulates the groups into one update.
    """
    by_length: dict[int, list[TrainSample]] = {}
    for sample in samples:
        length = bucket_length(len(sample.tokens))
        by_length.setdefault(min(length, max_len) if max_len else length, []).append(sample)
    return [by_length[length] for length in sorted(by_length, reverse=True)]


def assemble_batch(
    samples: list[TrainSample], *, pad_id: int, rows_multiple: int = 1, max_len: int | None = None
) -> dict[str, np.ndarray]:
    """Right-pad samples into arrays for the train step.

    Returns tokens [B, T] int32, mask [B, T] (real tokens), loss_mask [B, T], behaviour_logp
    [B, T], advantages [B, T] (the sample's advantage times its weight on generated tokens)
    and is_designer [B]. B is padded up to a multiple of `rows_multiple` (the data-parallel size)
    with all-masked rows; T is bucketed. Sequences longer than `max_len` keep their first
    `max_len` tokens.
    """
    if not samples:
        raise ValueError("cannot assemble an empty batch")
    longest = max(len(s.tokens) for s in samples)
    if max_len is not None:
        longest = min(longest, max_len)
    length = bucket_length(longest)
    if max_len is not None:
        length = min(length, max_len)
    rows = -(-len(samples) // rows_multiple) * rows_multiple
    batch = {
        "tokens": np.full((rows, length), pad_id, np.int32),
        "mask": np.zeros((rows, length), bool),
        "loss_mask": np.zeros((rows, length), bool),
        "behaviour_logp": np.zeros((rows, length), np.float32),
        "advantages": np.zeros((rows, length), np.float32),
        "is_designer": np.zeros((rows,), bool),
    }
    for row, sample in enumerate(samples):
        n = min(len(sample.tokens), length)
        batch["tokens"][row, :n] = sample.tokens[:n]
        batch["mask"][row, :n] = True
        batch["loss_mask"][row, :n] = sample.loss_mask[:n]
        batch["behaviour_logp"][row, :n] = np.where(sample.loss_mask[:n],
                                                    sample.behaviour_logp[:n], 0.0)
        batch["advantages"][row, :n] = np.where(
            sample.loss_mask[:n], sample.advantage * sample.weight, 0.0
        )
        batch["is_designer"][row] = sample.role is Role.DESIGNER
    return batch


def row_bucket(rows: int, data_parallel: int, micro_rows: int) -> int:
    """Rows of a call holding `rows` samples: `data_parallel` times a power of two, at most
    `micro_rows` (a few row counts, few compiles; a short call is not padded to a micro-batch)."""
    if not 1 <= rows <= micro_rows or micro_rows % data_parallel:
        raise ValueError(f"rows={rows} must be in [1, micro_rows={micro_rows}] and micro_rows a "
                         f"multiple of data_parallel={data_parallel}")
    bucket = data_parallel
    while bucket < rows:
        bucket *= 2
    return min(bucket, micro_rows)


def train_groups(samples: list[TrainSample], *, pad_id: int, data_parallel: int,
                 micro_batch: int, max_len: int) -> list[tuple[dict[str, np.ndarray], int]]:
    """The train step's (batch, micro-batches) calls for `samples`: few distinct shapes.

    Per length group (`length_groups`), one call per full micro-batch (`micro_batch` rounded up
    to the data-parallel size) and the remaining rows padded to a `row_bucket`. Shapes are
    therefore (micro rows or a bucket) x (a power-of-two length), whatever the sample count, so
    a run compiles each only once (`TrainStep.grouped` accumulates the calls exactly; padding
    rows have no loss token and weigh nothing).
    """
    micro_rows = -(-micro_batch // data_parallel) * data_parallel
    calls = []
    for group in length_groups(samples, max_len):
        for start in range(0, len(group), micro_rows):
            part = group[start:start + micro_rows]
            batch = assemble_batch(part, pad_id=pad_id, max_len=max_len,
                                   rows_multiple=row_bucket(len(part), data_parallel,
                                                            micro_rows))
            batch.pop("is_designer")
            calls.append((batch, 1))
    return calls
