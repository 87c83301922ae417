"""Prompt-lookup drafts: the tokens a row's own history predicts for its next positions.

Speculative decoding without a draft model (prompt lookup, as in vLLM's n-gram proposer): the
row's last n tokens are looked up in its earlier tokens, and what followed their latest earlier
occurrence is proposed as its next tokens. A decode step then verifies the proposals in one
forward (`programs.decode`'s `draft_tokens`), greedy or sampled, so a row that repeats
itself, as small models' long answers and game plays often do, takes several tokens per step.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

NGRAM_SIZES = (4, 3, 2)  # lookup lengths, the longest that occurs wins


def ngram_drafts(history: jax.Array, last: jax.Array, n_drafts: int,
                 ngram_sizes: tuple[int, ...] = NGRAM_SIZES) -> jax.Array:
    """[B, n_drafts] proposed tokens for each row's positions last+1, last+2, ...

    history [B, W]: row r's tokens by position, valid at [0, last[r]] (`last` [B]: the index
    of its newest token). For the longest n in `ngram_sizes` whose final n-gram (ending at
    `last`) occurred earlier, the proposal continues from the latest such occurrence: the
    tokens after it, repeated cyclically when the occurrence is closer than `n_drafts` (a
    loop of period p proposes its next n_drafts tokens). A row with no occurrence proposes
    its newest token repeated. Drafts only cost a wasted verification when wrong, never a
    changed output.
    """
    batch, width = history.shape
    last = last.astype(jnp.int32)
    follow = jnp.full((batch,), -1, jnp.int32)  # index after the chosen occurrence
    for n in sorted(ngram_sizes):  # longer sizes override shorter ones
        if n >= width:
            continue
        tail = jnp.take_along_axis(history, jnp.clip(last[:, None] - n + 1 + jnp.arange(n),
                                                     0, width - 1), axis=1)
        starts = jnp.arange(width - n + 1)
        match = (starts[None, :] + n - 1 < last[:, None]) & (last[:, None] >= n - 1)
        for i in range(n):
            match &= history[:, i:width - n + 1 + i] == tail[:, i:i + 1]
        latest = jnp.max(jnp.where(match, starts[None, :], -1), axis=1)
        follow = jnp.where(latest >= 0, latest + n, follow)
    period = jnp.maximum(last + 1 - follow, 1)
    index = follow[:, None] + jnp.arange(n_drafts)[None, :] % period[:, None]
    index = jnp.where(follow[:, None] >= 0, index, last[:, None])
    return jnp.take_along_axis(history, jnp.clip(index, 0, width - 1), axis=1)


def confirmed_drafts(drafts: jax.Array, chosen: jax.Array) -> jax.Array:
    """[B] how many leading drafts [B, k] the verification's choices [B, k+1] confirm: draft i
    stands when it equals the token chosen after the tokens before it (`chosen[:, i]`)."""
    agree = (drafts == chosen[:, :-1]).astype(jnp.int32)
    return jnp.sum(jnp.cumprod(agree, axis=1), axis=1)

