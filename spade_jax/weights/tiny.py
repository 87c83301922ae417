"""Tiny random HF checkpoints (Llama, Qwen3, Qwen3-MoE) built by `transformers`, for tests.

`transformers` builds the PyTorch model from a config and `save_pretrained` writes it as
safetensors, so our importer and our logits are checked against an independent implementation
with no download. Needs torch (the `[test]` extra). Weights are drawn larger than transformers'
default init (and norm weights away from 1) so parity tests exercise every parameter.
"""

from __future__ import annotations

from pathlib import Path

from spade_jax.models.config import Family

TINY_FAMILIES = tuple(Family)


def _hf_config(family: Family):
    import transformers

    common = dict(
        vocab_size=128,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        rms_norm_eps=1e-5,
        max_position_embeddings=256,
    )
    if family is Family.LLAMA:
        return transformers.LlamaConfig(
            **common, head_dim=8, tie_word_embeddings=True, rope_theta=10000.0
        )
    if family is Family.QWEN3:
        return transformers.Qwen3Config(
            **common, head_dim=16, tie_word_embeddings=False, rope_theta=1e6
        )
    if family is Family.QWEN3_MOE:
        return transformers.Qwen3MoeConfig(
            **common,
            head_dim=8,
            tie_word_embeddings=False,
            num_experts=4,
            num_experts_per_tok=2,
            moe_intermediate_size=16,
            norm_topk_prob=True,
            decoder_sparse_step=1,
            mlp_only_layers=[],
            rope_theta=1e6,
        )
    raise ValueError(f"family {family!r}: use one of {[f.value for f in TINY_FAMILIES]}")


def write_tiny_checkpoint(family: Family, directory: str | Path, *, seed: int = 0) -> Path:
    """Save a random tiny `family` model with `save_pretrained` into `directory`; return it."""
    import torch
    import transformers

    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(_hf_config(family))
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):
                param.copy_(1.0 + 0.1 * torch.randn_like(param))
            else:
                param.copy_(0.15 * torch.randn_like(param))
    directory = Path(directory)
    model.save_pretrained(str(directory))
    return directory
