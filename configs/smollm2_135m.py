"""SmolLM2-135M-Instruct on CPU: the embedded default, a few SPADE cycles in under 30 minutes."""

from spade_jax.defaults import arch, base_config


def get_config():
    c = base_config()
    c.total_cycles = 3
    c.model.source = "smollm2-135m-instruct"
    c.model.arch = arch(vocab_size=49152, d_model=576, n_layers=30, n_heads=9, n_kv_heads=3,
                        head_dim=64, ffn_dim=1536, rope_theta=100000.0, rms_eps=1e-5,
                        tie_embeddings=True, max_position=8192, family="llama")
    # Token budgets and context cut for speed (minutes per cycle on 2 CPU cores); the reference's
    # are 16384 / 8192 per turn / 4096 / 32768 (docs/reference_parity.md). Step timeout, delay,
    # failed plays, hint timing and the blend keep the reference defaults.
    c.sampling.designer_max_new_tokens = 768
    c.sampling.agent_max_new_tokens = 48
    c.sampling.hint_max_new_tokens = 64
    c.sampling.max_context = 4096
    c.train.learning_rate = 1e-5  # reference 1e-6: a short run must move the weights
    c.train.seq_len = 4096
    c.train.micro_batch = 4
    # Fewer and shorter games than the reference, for CPU speed.
    c.spade.regen_interval = 2
    c.spade.skills_per_regen = 2
    c.spade.games_per_cycle = 1  # one design (two attempts) per regeneration: the 2k-token
    # Designer prompt dominates generation and training time on 2 CPU cores
    c.spade.plays_per_env = 4
    c.spade.hint_plays_per_env = 4  # reference 16: the plays dominate a CPU cycle's sampling
    # reference True: filling the 192-sample batch would play one environment 64 times or more
    c.spade.fill_batch = False
    c.spade.top_up = False  # reference True: a Designer call costs a CPU cycle minutes
    # reference True: at 48 tokens an answer is cut by the CPU budget, not by rambling, and
    # ending every play there would leave one-turn plays of return 0
    c.spade.cut_reply_truncates = False
    c.spade.max_turns = 4
    c.spade.max_attempts = 2
    # Memory replays (reference: none): without them a small model, which rarely writes a
    # valid environment, would often give the Agent nothing to play.
    c.spade.replay_per_cycle = 2
    c.corpus.max_words = 300
    return c
