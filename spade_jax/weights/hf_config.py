"""Translate between HF `config.json` and our `ModelConfig` (Llama, Qwen3, Qwen3-MoE).

Only what our decoder computes is accepted: anything that would silently change the maths
(biases, non-default RoPE scaling, sliding windows, dense layers inside a MoE stack, a non-SiLU
activation) is refused with a message naming the field.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from spade_jax.errors import CheckpointError, MissingFileError
from spade_jax.models.config import Family, ModelConfig

SUPPORTED_MODEL_TYPES = tuple(Family)


def read_config_json(directory: Path) -> dict[str, Any]:
    """The parsed `config.json` of an HF checkpoint directory."""
    path = Path(directory) / "config.json"
    if not path.is_file():
        raise MissingFileError(
            f"{path} not found: an HF checkpoint directory needs config.json next to its "
            "*.safetensors files (download the whole repository, e.g. `hf download <repo> "
            "--local-dir DIR`)"
        )
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise CheckpointError(f"{path} is not valid JSON: {err}") from err


def _rope_theta(hf: dict[str, Any], where: str) -> float:
    rope = hf.get("rope_parameters") or hf.get("rope_scaling") or {}
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    if rope_type != "default":
        raise CheckpointError(
            f"{where}: RoPE type {rope_type!r} is not supported (only default rotary "
            "embeddings); use a checkpoint without rope scaling"
        )
    return float(rope.get("rope_theta", hf.get("rope_theta", 10000.0)))


def _refuse(hf: dict[str, Any], where: str) -> None:
    unsupported = {
        "attention_bias": hf.get("attention_bias", False),
        "mlp_bias": hf.get("mlp_bias", False),
        "use_sliding_window": hf.get("use_sliding_window", False),
        "mlp_only_layers": bool(hf.get("mlp_only_layers")),
        "decoder_sparse_step": hf.get("decoder_sparse_step", 1) != 1,
        "hidden_act": hf.get("hidden_act", "silu") != "silu",
    }
    bad = [name for name, value in unsupported.items() if value]
    if bad:
        raise CheckpointError(
            f"{where}: unsupported settings {', '.join(f'{b}={hf[b]!r}' for b in bad)}; "
            "spade_jax implements bias-free SiLU decoders with full attention and experts in "
            "every layer"
        )


def model_config_from_hf(hf: dict[str, Any], where: str = "config.json") -> ModelConfig:
    """Our ModelConfig for an HF config dict; CheckpointError for architectures we lack."""
    model_type = hf.get("model_type")
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise CheckpointError(
            f"{where}: model_type {model_type!r} is not supported; spade_jax loads "
            f"{', '.join(SUPPORTED_MODEL_TYPES)} checkpoints (Llama family incl. SmolLM2, "
            "Qwen3 dense, Qwen3-MoE)"
        )
    _refuse(hf, where)
    try:
        n_heads = int(hf["num_attention_heads"])
        d_model = int(hf["hidden_size"])
        family = Family(model_type)
        moe = family.is_moe
        cfg = ModelConfig(
            vocab_size=int(hf["vocab_size"]),
            d_model=d_model,
            n_layers=int(hf["num_hidden_layers"]),
            n_heads=n_heads,
            n_kv_heads=int(hf.get("num_key_value_heads") or n_heads),
            head_dim=int(hf.get("head_dim") or d_model // n_heads),
            ffn_dim=int(hf["intermediate_size"]),
            rope_theta=_rope_theta(hf, where),
            rms_eps=float(hf.get("rms_norm_eps", 1e-6)),
            tie_embeddings=bool(hf.get("tie_word_embeddings", False)),
            qk_norm=family.qk_norm,
            n_experts=int(hf.get("num_experts") or hf.get("num_local_experts") or 0) if moe else 0,
            n_experts_per_tok=int(hf.get("num_experts_per_tok", 0)) if moe else 0,
            expert_ffn_dim=int(hf.get("moe_intermediate_size", 0)) if moe else 0,
            norm_topk_prob=bool(hf.get("norm_topk_prob", False)) if moe else True,
            max_position=int(hf.get("max_position_embeddings", 32768)),
            family=family,
        )
    except KeyError as err:
        raise CheckpointError(f"{where}: required field {err.args[0]!r} is missing") from err
    try:
        cfg.validate()
    except ValueError as err:
        raise CheckpointError(f"{where}: {err}") from err
    return cfg


def hf_config_dict(cfg: ModelConfig, *, torch_dtype: str = "float32") -> dict[str, Any]:
    """The HF `config.json` contents for `cfg` (inverse of `model_config_from_hf`)."""
    if cfg.is_moe != cfg.family.is_moe:
        raise CheckpointError(
            f"family {cfg.family!r} with n_experts={cfg.n_experts}: experts need "
            "family='qwen3_moe' and family='qwen3_moe' needs experts"
        )
    hf: dict[str, Any] = {
        "architectures": [cfg.family.hf_architecture],
        "model_type": cfg.family.value,
        "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.d_model,
        "num_hidden_layers": cfg.n_layers,
        "num_attention_heads": cfg.n_heads,
        "num_key_value_heads": cfg.n_kv_heads,
        "head_dim": cfg.head_dim,
        "intermediate_size": cfg.ffn_dim,
        "hidden_act": "silu",
        "rms_norm_eps": cfg.rms_eps,
        "rope_parameters": {"rope_theta": cfg.rope_theta, "rope_type": "default"},
        "rope_theta": cfg.rope_theta,
        "tie_word_embeddings": cfg.tie_embeddings,
        "max_position_embeddings": cfg.max_position,
        "attention_bias": False,
        "dtype": torch_dtype,
    }
    if cfg.family is Family.LLAMA:
        hf["mlp_bias"] = False
    if cfg.family.is_moe:
        hf.update(
            num_experts=cfg.n_experts,
            num_experts_per_tok=cfg.n_experts_per_tok,
            moe_intermediate_size=cfg.expert_ffn_dim,
            norm_topk_prob=cfg.norm_topk_prob,
            decoder_sparse_step=1,
            mlp_only_layers=[],
        )
    return hf
