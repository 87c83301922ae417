"""`load_policy`: the user-facing facade over model, tokenizer, logits and generation.

    policy = spade_jax.load_policy("smollm2-135m-instruct")   # or an HF directory, a .gguf,
                                                              # or an HF Hub id in the local cache
    policy.logits(tokens)                                     # [B, T, vocab] float32
    policy.generate(["Hello"], max_new_tokens=32)
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import flax.nnx as nnx
import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from spade_jax import hf_cache
from spade_jax.errors import ConfigError, MissingFileError
from spade_jax.models.config import ModelConfig
from spade_jax.models.transformer import Transformer, forward_logits
from spade_jax.sharding import BATCH_AXES, fit_spec, make_mesh, param_shardings
from spade_jax.weights import (
    load_gguf,
    load_hf_model,
    load_tokenizer,
    smollm2_gguf_path,
)

BUILTIN_MODELS: dict[str, Callable[[], Path]] = {"smollm2-135m-instruct": smollm2_gguf_path}


def _logits_fn(graphdef, state, tokens, mask):
    return forward_logits(nnx.merge(graphdef, state), tokens, mask)


class Policy:
    """A loaded model with its tokenizer and mesh; `.logits` and `.generate` use it."""

    def __init__(self, model: Transformer, tokenizer: Any, mesh: Mesh):
        self.model = model
        self.tokenizer = tokenizer
        self.mesh = mesh
        self._jitted: dict[tuple, Callable] = {}

    @property
    def config(self) -> ModelConfig:
        return self.model.cfg

    def _sharding(self, spec: PartitionSpec, shape: tuple[int, ...]) -> NamedSharding:
        return NamedSharding(self.mesh, fit_spec(spec, shape, self.mesh))

    def logits(self, tokens, mask=None) -> jax.Array:
        """Float32 logits [B, T, vocab] of int tokens [B, T]; `mask` marks real (non-pad) tokens.

        Compiled once per input shape (the jitted function is cached on the policy).
        """
        tokens = np.asarray(tokens)
        if tokens.ndim != 2 or not np.issubdtype(tokens.dtype, np.integer):
            raise ConfigError(
                f"tokens must be an int array [batch, time], got {tokens.dtype}{tokens.shape}"
            )
        if tokens.size and (tokens.min() < 0 or tokens.max() >= self.config.vocab_size):
            raise ConfigError(
                f"token ids must lie in [0, {self.config.vocab_size}); got "
                f"{tokens.min()}..{tokens.max()}"
            )
        mask = np.ones(tokens.shape, bool) if mask is None else np.asarray(mask, bool)
        if mask.shape != tokens.shape:
            raise ConfigError(f"mask shape {mask.shape} must equal tokens shape {tokens.shape}")
        graphdef, state = nnx.split(self.model)
        key = (graphdef, tokens.shape)
        if key not in self._jitted:
            batch = self._sharding(PartitionSpec(BATCH_AXES, None), tokens.shape)
            out = self._sharding(
                PartitionSpec(BATCH_AXES, None, "tensor"),
                (*tokens.shape, self.config.vocab_size),
            )
            self._jitted[key] = jax.jit(
                _logits_fn,
                static_argnums=0,
                in_shardings=(param_shardings(state, self.mesh), batch, batch),
                out_shardings=out,
            )
        return self._jitted[key](graphdef, state, tokens.astype(np.int32), mask)

    def generate(
        self,
        prompts,
        *,
        max_new_tokens: int,
        temperature: float = 0.0,
        top_p: float = 1.0,
        top_k: int = 0,
        stop=None,
        seed: int = 0,
    ):
        """Sample continuations of `prompts` with the jitted sampler (greedy by default)."""
        from spade_jax import sampling  # the sampler imports the model; keep this module light

        return sampling.generate(
            self.model,
            self.tokenizer,
            prompts,
            max_new_tokens=max_new_tokens,
            temperature=temperature,
            top_p=top_p,
            top_k=top_k,
            stop=stop,
            seed=seed,
            mesh=self.mesh,
        )


def named_path(name_or_path: str | Path) -> Path:
    """The file a built-in model's name stands for, or the path given (what `model.source`
    and `model.tokenizer` name, before any check that it exists)."""
    builtin = BUILTIN_MODELS.get(str(name_or_path).lower())
    return builtin() if builtin is not None else Path(name_or_path).expanduser()


def resolve_model(name_or_path: str | Path) -> Path:
    """The checkpoint a `model.source` names: a built-in model's file, an HF directory, a
    .gguf file, or an HF Hub id (`owner/name`) found in the local Hugging Face cache."""
    path = named_path(name_or_path)
    if not path.exists() and hf_cache.HUB_ID.match(str(name_or_path)):
        path = hf_cache.snapshot(str(name_or_path))
    if not path.exists():
        raise MissingFileError(
            f"{name_or_path!r} is neither a built-in model ({', '.join(BUILTIN_MODELS)}) nor an "
            "existing path; pass an HF checkpoint directory, a .gguf file or an HF Hub id "
            "(owner/name) in the local Hugging Face cache"
        )
    if path.is_file() and path.suffix != ".gguf":
        raise ConfigError(f"{path} is a file but not a .gguf; pass a .gguf or an HF directory")
    return path


def load_policy(
    name_or_path: str | Path, *, mesh: Mesh | None = None, dtype=None,
    options: Mapping[str, Any] | None = None,
) -> Policy:
    """Load a policy by built-in name, HF safetensors directory, `.gguf` file, or HF Hub id
    (`owner/name`, read from the local `huggingface_hub` cache when no such path exists).

    Parameters are placed on `mesh` (default: the first device) in `dtype` (default float32).
    `options` sets `ModelConfig`'s non-architecture fields (`MODEL_OPTIONS`: the attention
    kernels, the MoE capacity and split) before the model is built, so the experts' weights
    are laid out as the split they run in needs.
    """
    path = resolve_model(name_or_path)
    mesh = mesh if mesh is not None else make_mesh((1, 1, 1), jax.devices()[:1])
    try:
        param_dtype = jnp.dtype(dtype or jnp.float32)
    except TypeError as err:
        raise ConfigError(f"dtype {dtype!r} is not a dtype; use 'float32' or 'bfloat16'") from err
    if path.is_dir():
        model = load_hf_model(path, mesh=mesh, param_dtype=param_dtype, options=options)
    else:
        model = load_gguf(path, mesh=mesh, param_dtype=param_dtype, options=options)
    return Policy(model, load_tokenizer(path), mesh)
