"""Tiny random model for tests and smoke runs: one SPADE cycle in about a minute on 2 CPU cores."""

from spade_jax.defaults import arch, base_config


def get_config():
    c = base_config()
    c.total_cycles = 2
    c.model.source = "random"
    c.model.arch = arch(vocab_size=49152, d_model=64, n_layers=2, n_heads=4, n_kv_heads=2,
                        head_dim=16, ffn_dim=128, rope_theta=10000.0, rms_eps=1e-5,
                        tie_embeddings=True, family="llama")
    # Token budgets and context cut for speed (a random model, seconds per cycle); the reference's
    # are 16384 / 8192 per turn / 4096 / 32768 (docs/reference_parity.md). Step timeout, delay,
    # failed plays, hint timing and the blend keep the reference defaults.
    c.sampling.designer_max_new_tokens = 64
    c.sampling.agent_max_new_tokens = 16
    c.sampling.hint_max_new_tokens = 16
    c.sampling.max_context = 4096
    c.train.learning_rate = 1e-4  # reference 1e-6: a short run must move the weights
    c.train.seq_len = 4096
    # Fewer and shorter games than the reference, for speed; hints come from the environments'
    # hint() (hint_mode designer) because a random model writes no usable hint.
    c.spade.skills_per_regen = 2
    c.spade.regen_interval = 2
    c.spade.games_per_cycle = 2
    c.spade.plays_per_env = 2
    c.spade.hint_plays_per_env = 2  # reference 16: fewer plays for a one-minute cycle
    # reference True: filling the 192-sample batch would play one environment 64 times or more
    c.spade.fill_batch = False
    c.spade.top_up = False  # reference True: a Designer call costs a CPU cycle minutes
    # reference True: at 16 tokens an answer is cut by the CPU budget, not by rambling, and
    # ending every play there would leave one-turn plays of return 0
    c.spade.cut_reply_truncates = False
    c.spade.max_turns = 3
    c.spade.max_attempts = 1
    # Memory replays (reference: none): without them a random model, which writes no valid
    # environment, would give the Agent nothing to play.
    c.spade.replay_per_cycle = 2
    c.spade.hint_mode = "designer"
    c.sandbox.warm_workers = 4
    c.corpus.max_words = 300
    return c
