"""Qwen3-30B-A3B-Instruct-2507: the SPADE paper's model (48 layers, 128 experts, top-8).

The paper's main games run, reference `cmd/games/train_spade_30b.sh`: every SPADE, sampling
and reward setting is `base_config`'s (the reference defaults, docs/reference_parity.md):
delay 4, KL 0, Designer 16384 / Agent 8192 tokens per turn, context 32768, temperature 0.6,
top-p 0.95, top-k 20, hint 4096 tokens at 0.3, 16 hint plays, blend 0.6 / 0.4.

Point model.source at a local HF checkpoint directory (e.g. copied from a gs:// bucket).
Each expert's 768 hidden columns are split over the 'tensor' axis (96 per rank;
`model.moe_sharding`, spade_jax/models/moe.py).
"""

from spade_jax.defaults import arch, base_config


def get_config():
    c = base_config()
    c.model.source = "checkpoints/Qwen3-30B-A3B-Instruct-2507"
    c.model.arch = arch(vocab_size=151936, d_model=2048, n_layers=48, n_heads=32, n_kv_heads=4,
                        head_dim=128, ffn_dim=6144, rope_theta=10000000.0, rms_eps=1e-6,
                        tie_embeddings=False, qk_norm=True, n_experts=128, n_experts_per_tok=8,
                        expert_ffn_dim=768, norm_topk_prob=True, family="qwen3_moe")
    c.model.param_dtype = "float32"  # master weights; matmuls in bf16
    c.model.compute_dtype = "bfloat16"
    c.mesh.update(dict(data=1, fsdp=-1, tensor=8))
    return c
