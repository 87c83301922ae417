"""Qwen3-32B (dense). Point model.source at a local HF checkpoint directory."""

from spade_jax.defaults import arch, base_config


def get_config():
    c = base_config()
    c.model.source = "checkpoints/Qwen3-32B"
    c.model.arch = arch(vocab_size=151936, d_model=5120, n_layers=64, n_heads=64, n_kv_heads=8,
                        head_dim=128, ffn_dim=25600, rope_theta=1000000.0, rms_eps=1e-6,
                        tie_embeddings=False, qk_norm=True, family="qwen3")
    c.model.param_dtype = "float32"  # master weights; matmuls in bf16
    c.model.compute_dtype = "bfloat16"
    c.mesh.update(dict(data=1, fsdp=-1, tensor=4))
    return c
