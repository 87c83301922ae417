"""Tiny random model for tests and smoke runs: one SPADE cycle in about a minute on 2 CPU cores."""

from spade_jax.config import arch, base_config


def get_config():
    c = base_config()
    c.total_cycles = 2
    c.model.source = "random"
    c.model.arch = arch(vocab_size=49152, d_model=64, n_layers=2, n_heads=4, n_kv_heads=2,
                        head_dim=16, ffn_dim=128, rope_theta=10000.0, rms_eps=1e-5,
                        tie_embeddings=True, family="llama")
    c.sampling.designer_max_new_tokens = 64
    c.sampling.agent_max_new_tokens = 16
    c.sampling.hint_max_new_tokens = 16
    c.sampling.max_context = 4096
    c.train.learning_rate = 1e-4
    c.train.seq_len = 4096
    c.spade.skills_per_regen = 2
    c.spade.regen_interval = 2
    c.spade.games_per_cycle = 2
    c.spade.plays_per_env = 2
    c.spade.max_turns = 3
    c.spade.max_attempts = 1
    c.spade.replay_per_cycle = 2
    c.spade.hint_mode = "designer"
    c.sandbox.warm_workers = 4
    c.corpus.max_words = 300
    return c
