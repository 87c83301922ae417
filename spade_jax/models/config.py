"""Architecture hyper-parameters of the one decoder that serves Llama, Qwen3 and Qwen3-MoE."""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Mapping
from typing import Any

from spade_jax.models.attention import AttentionKernel, DecodeAttention
from spade_jax.models.moe import MoeSharding

# ModelConfig's fields that are not architecture: the run config chooses them, a checkpoint
# does not carry them (config keys `model.<name>`)
MODEL_OPTIONS = ("attention", "decode_attention", "moe_capacity_factor", "moe_sharding")


class Family(enum.StrEnum):
    """The checkpoint family a model follows (its HF `model_type`): how its checkpoints are
    laid out when imported and exported."""

    LLAMA = "llama"
    QWEN3 = "qwen3"
    QWEN3_MOE = "qwen3_moe"

    @property
    def hf_architecture(self) -> str:
        """The `architectures` entry of its HF config.json."""
        return {Family.LLAMA: "LlamaForCausalLM", Family.QWEN3: "Qwen3ForCausalLM",
                Family.QWEN3_MOE: "Qwen3MoeForCausalLM"}[self]

    @property
    def qk_norm(self) -> bool:
        """Whether q and k get an RMSNorm over head_dim before RoPE (Qwen3)."""
        return self is not Family.LLAMA

    @property
    def is_moe(self) -> bool:
        return self is Family.QWEN3_MOE

    @property
    def gguf_permutes_qk(self) -> bool:
        """Whether llama.cpp stores its q/k rows permuted for interleaved RoPE (LLaMA)."""
        return self is Family.LLAMA


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """Shapes and switches of a decoder-only transformer.

    One dataclass for every family we support: Llama (SmolLM2), Qwen3 dense (q/k RMSNorm) and
    Qwen3-MoE (routed experts). Frozen so it can be a static argument of jitted functions.
    """

    vocab_size: int
    d_model: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    ffn_dim: int
    rope_theta: float = 10000.0
    rms_eps: float = 1e-6
    tie_embeddings: bool = False
    qk_norm: bool = False  # Qwen3: RMSNorm over head_dim on q and k before RoPE
    n_experts: int = 0  # 0 = dense MLP
    n_experts_per_tok: int = 0
    expert_ffn_dim: int = 0
    norm_topk_prob: bool = True
    max_position: int = 32768
    family: Family = Family.LLAMA  # decides the HF layout on import and export
    # Not architecture: which kernel runs causal attention (config key `model.attention`).
    attention: AttentionKernel = AttentionKernel.AUTO
    # Not architecture: which kernel runs a decode step's attention (`model.decode_attention`).
    decode_attention: DecodeAttention = DecodeAttention.AUTO
    # Not architecture: each expert-parallel rank's MoE buffer as a multiple of its balanced
    # share of token copies; copies past it are dropped (config key `model.moe_capacity_factor`,
    # None: dropless). See `moe.buffer_rows`.
    moe_capacity_factor: float | None = None
    # Not architecture: how the experts split over 'tensor' (config key `model.moe_sharding`).
    moe_sharding: MoeSharding = MoeSharding.FFN

    def __post_init__(self):
        for name, kind in (("attention", AttentionKernel), ("decode_attention", DecodeAttention),
                           ("moe_sharding", MoeSharding), ("family", Family)):
            value = getattr(self, name)
            if value not in tuple(kind):
                raise ValueError(f"{name}={value!r}: use one of {tuple(k.value for k in kind)}")
            object.__setattr__(self, name, kind(value))

    @property
    def is_moe(self) -> bool:
        return self.n_experts > 0

    def validate(self) -> None:
        """Raise ValueError with an actionable message when the shapes cannot work."""
        problems = []
        if self.n_heads % self.n_kv_heads:
            problems.append(
                f"n_heads={self.n_heads} must be a multiple of n_kv_heads={self.n_kv_heads}"
            )
        if self.head_dim % 2:
            problems.append(f"head_dim={self.head_dim} must be even for rotary embeddings")
        if self.is_moe and not 0 < self.n_experts_per_tok <= self.n_experts:
            problems.append(f"n_experts_per_tok={self.n_experts_per_tok} must be in "
                            f"1..n_experts={self.n_experts}")
        if self.is_moe and self.expert_ffn_dim <= 0:
            problems.append("expert_ffn_dim must be > 0 for a mixture-of-experts model")
        if self.moe_capacity_factor is not None and not self.moe_capacity_factor > 0:
            problems.append(f"moe_capacity_factor={self.moe_capacity_factor!r} must be > 0 "
                            "(or None for dropless experts)")
        if problems:
            raise ValueError("invalid model config: " + "; ".join(problems))

    def with_options(self, options: Mapping[str, Any] | None) -> ModelConfig:
        """This architecture with `options`, a mapping of `MODEL_OPTIONS` fields (None: as is).
        A checkpoint gives the architecture, the run config these."""
        unknown = set(options or ()) - set(MODEL_OPTIONS)
        if unknown:
            raise ValueError(f"model options {sorted(unknown)}: only {MODEL_OPTIONS} are not "
                             "the checkpoint's architecture")
        return self.replace(**(options or {}))

    def replace(self, **changes) -> ModelConfig:
        """A copy with `changes` applied (e.g. fewer layers for a compile check)."""
        return dataclasses.replace(self, **changes)
