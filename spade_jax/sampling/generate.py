"""`generate`: one-call text generation over the session sampler (what Policy.generate uses)."""

from __future__ import annotations

import dataclasses
import weakref
from collections.abc import Sequence
from typing import Any

import flax.nnx as nnx
from jax.sharding import Mesh

from spade_jax.models.transformer import Transformer
from spade_jax.sampling.sampler import Sampler
from spade_jax.sampling.session import FinishReason

_SAMPLERS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


@dataclasses.dataclass
class Completion:
    """One generated continuation.

    `tokens` / `logprobs` are everything sampled (including a final stop token, whose log-prob
    the loss needs); `text` is the decoded text without the stop token and cut before the first
    stop string. With a stop string the tokens are cut after the token that completes it.
    """

    text: str
    tokens: list[int]
    logprobs: list[float]
    finish_reason: FinishReason


def sampler_for(model: Transformer, mesh: Mesh | None = None) -> Sampler:
    """A cached Sampler for `model` (compiled programs are reused) with its current weights."""
    per_model = _SAMPLERS.setdefault(model, {})
    key = id(mesh) if mesh is not None else None
    if key not in per_model:
        per_model[key] = Sampler(model, mesh=mesh)
    else:
        per_model[key].set_params(nnx.state(model))
    return per_model[key]


def encode_prompt(tokenizer: Any, prompt: str | Sequence[dict]) -> list[int]:
    """Token ids of a plain string or of chat messages (chat template + generation prompt)."""
    if isinstance(prompt, str):
        return list(tokenizer.encode(prompt, add_special_tokens=False))
    text = tokenizer.apply_chat_template(list(prompt), tokenize=False, add_generation_prompt=True)
    return list(tokenizer.encode(text, add_special_tokens=False))


def _cut_at_stop_string(tokenizer, tokens: list[int], stops: list[str]):
    """(tokens, text) cut at the earliest stop string, or None when no stop string occurs."""
    text = tokenizer.decode(tokens, skip_special_tokens=False)
    hits = [text.find(s) for s in stops if s in text]
    if not hits:
        return None
    cut = min(hits)
    for n in range(1, len(tokens) + 1):  # the shortest prefix whose text contains a stop
        prefix = tokenizer.decode(tokens[:n], skip_special_tokens=False)
        if any(s in prefix for s in stops):
            return tokens[:n], text[:cut]
    return None


def generate(
    model: Transformer,
    tokenizer: Any,
    prompts: Sequence[str | Sequence[dict]],
    *,
    max_new_tokens: int,
    temperature: float = 0.0,
    top_p: float = 1.0,
    top_k: int = 0,
    stop: Sequence[str | int] | None = None,
    seed: int = 0,
    mesh: Mesh | None = None,
    ignore_eos: bool = False,
    sampler: Sampler | None = None,
) -> list[Completion]:
    """Generate a completion for each prompt (strings, or chat message lists).

    `stop` mixes stop strings and stop token ids; the tokenizer's EOS always stops unless
    `ignore_eos` (benchmarks). Stop strings are matched on the host after decoding, so the
    device may generate past them; the completion is cut back. `sampler`: a Sampler of `model`
    to run instead of the cached one (`sampler_for`), e.g. one with other compile options.
    """
    stop = list(stop or ())
    stop_ids = [s for s in stop if isinstance(s, int)]
    stop_strings = [s for s in stop if isinstance(s, str)]
    if not ignore_eos and tokenizer.eos_token_id is not None:
        stop_ids.append(int(tokenizer.eos_token_id))
    prompt_ids = [encode_prompt(tokenizer, p) for p in prompts]
    sampler = sampler if sampler is not None else sampler_for(model, mesh)
    capacity = max(len(p) for p in prompt_ids) + max_new_tokens
    session = sampler.start(prompt_ids, capacity=capacity)
    turns = session.decode(max_new_tokens, temperature=temperature, top_k=top_k, top_p=top_p,
                           stop_token_ids=sorted(set(stop_ids)), seed=seed)
    completions = []
    for turn in turns:
        tokens, logprobs, reason = turn.tokens, turn.logprobs, turn.finish_reason
        cut = _cut_at_stop_string(tokenizer, tokens, stop_strings) if stop_strings else None
        if cut is not None:
            tokens, text = cut
            logprobs, reason = logprobs[: len(tokens)], FinishReason.STOP
        else:
            body = tokens[:-1] if reason is FinishReason.STOP else tokens
            text = tokenizer.decode(body, skip_special_tokens=False)
        completions.append(Completion(text, tokens, logprobs, reason))
    return completions
