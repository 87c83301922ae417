"""Jitted KV-cache sampling: `generate` for one-shot text, `Sampler`/`Session` for multi-turn."""

from spade_jax.sampling.engine import Conversation, Engine, Request
from spade_jax.sampling.generate import Completion, encode_prompt, generate, sampler_for
from spade_jax.sampling.sampler import DecodeDots, DecodeWeights, Sampler
from spade_jax.sampling.sampling_fns import select_tokens
from spade_jax.sampling.session import CacheFullError, Session, TurnOutput

__all__ = [
    "CacheFullError",
    "Completion",
    "Conversation",
    "DecodeDots",
    "DecodeWeights",
    "Engine",
    "Request",
    "Sampler",
    "Session",
    "TurnOutput",
    "encode_prompt",
    "generate",
    "sampler_for",
    "select_tokens",
]
