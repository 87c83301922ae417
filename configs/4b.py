"""Qwen3-4B-Instruct-2507 (dense, tied embeddings). Point model.source at a local HF checkpoint
directory.

Reference `cmd/games/train_spade_4b.sh`: the games defaults of `base_config` (delay 4, KL 0,
Designer 16384 tokens). Its later phase (reference `cmd/games/README.md`) resumes with a
49152-token context and the plateau band [0.2, 0.4], ramp 0.2:
    --config.sampling.max_context=49152 --config.spade.blend.plateau_lo=0.2
    --config.spade.blend.plateau_hi=0.4 --config.spade.blend.plateau_ramp=0.2
"""

from spade_jax.defaults import arch, base_config


def get_config():
    c = base_config()
    c.model.source = "checkpoints/Qwen3-4B-Instruct-2507"
    c.model.arch = arch(vocab_size=151936, d_model=2560, n_layers=36, n_heads=32, n_kv_heads=8,
                        head_dim=128, ffn_dim=9728, rope_theta=5000000.0, rms_eps=1e-6,
                        tie_embeddings=True, qk_norm=True, family="qwen3")
    c.model.param_dtype = "float32"  # master weights; matmuls in bf16
    c.model.compute_dtype = "bfloat16"
    c.mesh.update(dict(data=1, fsdp=-1, tensor=1))
    return c
