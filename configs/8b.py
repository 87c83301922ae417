"""Qwen3-8B (dense). Point model.source at a local HF checkpoint directory.

Reference `cmd/games/train_spade_8b.sh`: the games defaults of `base_config` except a
20000-token Designer budget and a KL penalty of 0.005 (low-variance estimator). The reference
also turns Qwen3 thinking on for both roles, which this config does not model.
"""

from spade_jax.defaults import arch, base_config


def get_config():
    c = base_config()
    c.model.source = "checkpoints/Qwen3-8B"
    c.model.arch = arch(vocab_size=151936, d_model=4096, n_layers=36, n_heads=32, n_kv_heads=8,
                        head_dim=128, ffn_dim=12288, rope_theta=1000000.0, rms_eps=1e-6,
                        tie_embeddings=False, qk_norm=True, family="qwen3")
    c.model.param_dtype = "float32"  # master weights; matmuls in bf16
    c.model.compute_dtype = "bfloat16"
    c.mesh.update(dict(data=1, fsdp=-1, tensor=1))
    c.sampling.designer_max_new_tokens = 20000  # reference --spade-env-max-tokens 20000
    c.train.kl_coef = 0.005  # reference --kl-loss-coef 0.005
    return c
