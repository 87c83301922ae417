"""The defaults every `configs/*.py` starts from: each key a run understands, commented.

`base_config()` holds the reference recipe's values where they apply and is locked, so a
mistyped key in a config file or on the command line (`--config.spade.plays_per_env=4`) fails
at once instead of being silently ignored. `spade_jax.config.parse` turns the result into
typed records at start-up.
"""

from __future__ import annotations

import ml_collections

from spade_jax.config import Mode
from spade_jax.models.attention import AttentionKernel, DecodeAttention
from spade_jax.models.moe import MoeSharding
from spade_jax.rl.losses import LossAggregation
from spade_jax.rl.trainer import Remat
from spade_jax.sampling.sampler import (
    DRAFT_TOKENS,
    PREFILL_TOKENS_PER_DEVICE,
    DecodeDots,
    DecodeWeights,
)
from spade_jax.spade.hints import HintMode, HintSchedule
from spade_jax.spade.memory import MemoryMode
from spade_jax.spade.prompts import GameType
from spade_jax.spade.rewards import (
    FailedPlays,
    LPUpdate,
    RewardVariant,
    RoleScaleCounts,
    StepErrors,
)


def arch(**fields) -> ml_collections.ConfigDict:
    """Architecture block (ModelConfig field names) with defaults for unspecified fields."""
    base = dict(
        vocab_size=0, d_model=0, n_layers=0, n_heads=0, n_kv_heads=0, head_dim=0, ffn_dim=0,
        rope_theta=10000.0, rms_eps=1e-6, tie_embeddings=False, qk_norm=False, n_experts=0,
        n_experts_per_tok=0, expert_ffn_dim=0, norm_topk_prob=True, max_position=32768,
        family="llama",
    )
    unknown = set(fields) - set(base)
    if unknown:
        raise ValueError(f"unknown architecture fields {sorted(unknown)}; known: {sorted(base)}")
    base.update(fields)
    return ml_collections.ConfigDict(base)


def base_config() -> ml_collections.ConfigDict:
    """Every key a run understands, with the reference recipe's values where they apply."""
    c = ml_collections.ConfigDict()
    c.seed = 0
    c.total_cycles = 400
    c.mode = Mode.SPADE.value  # spade | fixed (the paper's fixed-environment baseline)
    # fixed mode: 'seeds', 'reasoning_gym[:CAT,...]' or a directory of environment .py files
    c.fixed_pool = "seeds"

    c.model = ml_collections.ConfigDict()
    # 'smollm2-135m-instruct', an HF directory, a .gguf file, or 'random' (built from arch).
    c.model.source = "random"
    c.model.tokenizer = "smollm2-135m-instruct"  # used when source is 'random'
    c.model.arch = arch()
    # The master weights the optimizer updates: float32 (a bf16 weight does not move at lr
    # 1e-6). compute_dtype is the matmul dtype of training and of the sampler's weight copy.
    c.model.param_dtype = "float32"
    c.model.compute_dtype = "float32"
    # Causal attention kernel: auto (splash on TPU, cuDNN on GPU in bf16/fp16, else xla),
    # xla, splash (Pallas; interpreted off TPU) or cudnn. Cached extends run XLA.
    c.model.attention = AttentionKernel.AUTO.value
    # A decode step's attention over the KV cache: auto (ragged on TPU, else xla), xla (every
    # row against the whole window) or ragged (Pallas: each row's keys only up to its own
    # length; needs the sequence-major cache, interpreted off TPU). See models/ragged_decode.py.
    c.model.decode_attention = DecodeAttention.AUTO.value
    # Mixture of experts: None = dropless (the checkpoint's model); c = under
    # moe_sharding=experts each rank computes at most c x its balanced share of token copies
    # and drops the rest.
    c.model.moe_capacity_factor = ml_collections.config_dict.placeholder(float)
    # How the experts split over mesh.tensor: ffn (every expert's F/tp hidden columns per rank,
    # as MaxText and Tunix split them over their tensor axis; buffers of exactly the tokens'
    # copies, equal work per rank) or experts (E/tp whole experts per rank, expert parallelism;
    # dropless buffers sized for the worst case, tp x the balanced work where the grouped
    # matmul cannot skip empty tiles: CPU, GPU). See spade_jax/models/moe.py.
    c.model.moe_sharding = MoeSharding.FFN.value

    c.mesh = ml_collections.ConfigDict(dict(data=1, fsdp=-1, tensor=1))  # -1: fill with devices

    # Per role, as the reference (docs/reference_parity.md): Designer = its `env_*`, Agent =
    # its `actor_*`; the hint call passes no top-p, so its adapter's default 0.9 applies.
    c.sampling = ml_collections.ConfigDict()
    c.sampling.designer_temperature = 0.6
    c.sampling.designer_top_p = 0.95
    c.sampling.designer_top_k = 20
    c.sampling.designer_max_new_tokens = 16384
    c.sampling.agent_temperature = 0.6
    c.sampling.agent_top_p = 0.95
    c.sampling.agent_top_k = 20
    c.sampling.agent_max_new_tokens = 8192  # per turn
    c.sampling.hint_temperature = 0.3
    c.sampling.hint_top_p = 0.9
    c.sampling.hint_top_k = 0  # off: the reference leaves Slime's --rollout-top-k at -1
    c.sampling.hint_max_new_tokens = 4096  # games; 2048 in the tool-use recipes
    # The self-validation verdict (spade.self_validation): the reference's env_validator_*
    # (temperature 0.3, 16384 tokens) through the same adapter as the hint call (top-p 0.9,
    # no top-k).
    c.sampling.validator_temperature = 0.3
    c.sampling.validator_top_p = 0.9
    c.sampling.validator_top_k = 0
    c.sampling.validator_max_new_tokens = 16384
    c.sampling.max_context = 32768
    # Tokens one prefill / observation-append call computes per device (its rows x width);
    # longer prompts are written in successive chunks. A narrower extend holds fewer
    # temporaries: `python -m spade_jax.plan --compiled` prints the extend's peak per device.
    c.sampling.prefill_tokens = PREFILL_TOKENS_PER_DEVICE
    # On CPU only: the decode programs' dots through YNNPACK's fusions (XLA's default) or
    # XLA's own dot emitter, see spade_jax/sampling/sampler.py.
    c.sampling.cpu_decode_dots = DecodeDots.YNNPACK.value
    # Where the weights are split over fsdp: a decode loop holds the MoE experts gathered
    # (resident, the fastest: XLA hoists their gathers) or gathers each layer's weights every
    # step (per_step: for chips that cannot hold the gathered experts, e.g. 30B at 32k on
    # v5e); `python -m spade_jax.plan` counts them.
    c.sampling.decode_weights = DecodeWeights.RESIDENT.value
    # Decode steps verify this many prompt-lookup drafts per row while the lookups show they
    # pay: the next tokens that followed the row's last few tokens earlier in its own text,
    # kept up to the first the model's choice contradicts. Greedy and sampled outputs are
    # unchanged, since a sampled token depends on its position's key alone
    # (spade_jax/sampling/drafts.py, docs/DESIGN.md §5.3). 0: no drafts.
    c.sampling.draft_tokens = DRAFT_TOKENS

    c.train = ml_collections.ConfigDict()
    c.train.learning_rate = 1e-6
    c.train.b1 = 0.9
    c.train.b2 = 0.98
    c.train.weight_decay = 0.1
    c.train.grad_clip = 1.0
    c.train.clip_low = 0.2
    c.train.clip_high = 0.28
    # TIS cap on exp(train logp - sampler logp) for every sample (0: off); Slime --use-tis
    # with its --tis-clip default 2.0, as every reference recipe.
    c.train.tis_cap = 2.0
    c.train.kl_coef = 0.0  # low-variance KL to the initial weights; 0.005 in 8B / tool-use
    c.train.loss_aggregation = LossAggregation.SAMPLE_MEAN.value  # sample_mean | token_mean
    c.train.remat = Remat.BLOCK.value  # none | block
    c.train.micro_batch = 8  # sequences per micro-batch (gradient accumulation is exact)
    c.train.seq_len = 32768  # longest trained sequence (memory plan)

    c.spade = ml_collections.ConfigDict()
    c.spade.skills = ()  # empty: every skill of spade.game_type (six games or six tool-use)
    c.spade.skills_per_regen = 3
    c.spade.regen_interval = 4
    c.spade.games_per_cycle = 24
    c.spade.plays_per_env = 8  # K no-hint plays
    c.spade.hint_plays_per_env = 16  # hint plays; play i < K shares no-hint play i's seed
    c.spade.hint_plays_when = HintSchedule.REGEN.value  # regen | every_cycle
    # Samples of one train step, Designer samples first, the surplus Agent samples dropped
    # (reference --global-batch-size: 24 games x 8 plays; a regen cycle's 24 Designer samples
    # push out 24 Agent samples); 0: no limit.
    c.spade.global_batch_size = 192
    # A cycle playing fewer environments than global_batch_size / plays_per_env plays each
    # ceil(global_batch_size / environments) times, and duplicates its Agent samples round-robin
    # until they and this regen cycle's designs fill the batch (reference orchestrator Stages 4
    # and 7: a pool short of valid games trains a full batch).
    c.spade.fill_batch = True
    # A pool short of games_per_cycle valid environments between regenerations is refilled by
    # the Designer (reference orchestrator Stage 2); the refills get no hint plays, are never
    # trained as Designer samples nor stored in memory, and are replaced at the next regen.
    c.spade.top_up = True
    # An Agent play that ends without terminating (turn limit, full context) trains no token
    # (reference --spade-compact-filter: off in the games recipes, on in the tool-use ones).
    c.spade.compact_filter = False
    c.spade.failed_plays = FailedPlays.DROP.value  # drop | score (-1)
    # A step that raises or breaks the contract: lose (reference: the play ends terminated at
    # reward -1 and is trained) | fail (the play failed: spade.failed_plays decides)
    c.spade.step_errors = StepErrors.LOSE.value
    # A no-hint play whose reply used its whole token budget without an end-of-turn token ends
    # there, unstepped, truncated (return 0), as the reference's no-hint arm; its hint arm
    # steps the cut reply, as ours
    c.spade.cut_reply_truncates = True
    # A played environment keeps the turn limit its constructor sets by default, capped at
    # spade.max_turns (reference respect_game_max_turns); False: every game gets max_turns
    c.spade.game_turns = True
    # An environment with a timed-out play is left out of later cycles until the pool is
    # replaced (True), or played again next cycle as the reference, whose orchestrator and its
    # hung-game blacklist are rebuilt every rollout (False)
    c.spade.keep_blacklist = False
    # A regeneration that admits no environment leaves the pool empty, as the reference deletes
    # the last rollout's games first (with top_up the next cycle designs a full pool), or keeps
    # the last pool for the Agent (True)
    c.spade.keep_last_pool = False
    c.spade.max_turns = 25
    c.spade.max_attempts = 5
    c.spade.game_type = GameType.GAME.value  # game | tool_use
    # The policy judges each environment that passed the gate against the spec (reference
    # --spade-use-env-validator: on in the tool-use recipes); a rejected design is invalid.
    c.spade.self_validation = False
    c.spade.reward_variant = RewardVariant.BLEND.value
    # False (reference): an invalid design is retried and never trained; True: trained at -1.
    c.spade.penalize_invalid = False
    c.spade.hint_mode = HintMode.SELF.value  # self | designer
    c.spade.designer_delay = 4  # cycles before Designer samples are trained (tool use: 8)
    c.spade.final_flush = True  # the last cycle trains every Designer sample still waiting
    c.spade.lp_update = LPUpdate.BEFORE_SCORING.value  # before_scoring | after_scoring
    c.spade.role_scale_counts = RoleScaleCounts.VALID.value  # valid | trained
    # Blend reward: plateau_weight * plateau(win; band [plateau_lo, plateau_hi], ramp) +
    # regret_weight * clip(regret / regret_scale, 0, 1) (no clip without regret_floor).
    c.spade.blend = ml_collections.ConfigDict(dict(
        plateau_weight=0.6, regret_weight=0.4, regret_scale=0.15, regret_floor=True,
        plateau_lo=0.4, plateau_hi=0.6, plateau_ramp=0.25))
    # Delayed regret: hint plays against the regen cycle's no-hint plays (True), or against
    # every no-hint play of the delay window (False, the reference `regret` variant).
    c.spade.matched_timing = True
    # Memory environments replayed each cycle (by PLR priority); the reference never replays
    # them (its memory only feeds the Designer's prompt).
    c.spade.replay_per_cycle = 0
    c.spade.no_corpus = False
    c.spade.no_memory = False
    c.spade.no_designer_training = False

    # mode: which record a full memory evicts, the oldest (fifo, reference) or the lowest PLR
    # score (plr)
    c.memory = ml_collections.ConfigDict(dict(capacity=200, mode=MemoryMode.FIFO.value,
                                              staleness_coef=0.3))
    c.corpus = ml_collections.ConfigDict(dict(source="stdlib", max_words=6000, data_dir=""))

    # step_timeout_s: seconds one environment call (reset or step) may run before the play
    # ends; play_timeout_s: seconds all of one play's environment calls may take together
    # (the reference's 300 s per game; generation is batched across plays, so it is not
    # counted); validation_timeout_s: seconds the gate's random-action run may take (60);
    # step_wait_s: seconds a rollout waits for an Agent's environment step before decoding on
    # without it, so a slow environment holds only its own episode (inf: wait for every step,
    # the schedule then depends on the sampled tokens alone)
    c.sandbox = ml_collections.ConfigDict(dict(allow_unsafe=False, warm_workers=8,
                                               step_timeout_s=30.0, play_timeout_s=300.0,
                                               validation_timeout_s=60.0, step_wait_s=1.0))

    c.checkpoint_every = 1
    c.keep_checkpoints = 3
    # In-loop evaluation every `every` cycles (0: off) on a fixed subset: `limit` items per suite
    # (spade_jax.eval.runner.SUITE_NAMES); `games` is 'seeds' or a directory of env files.
    c.eval = ml_collections.ConfigDict(dict(every=0, suites="games", limit=8, games="seeds"))
    # Metrics always go to metrics.jsonl and TensorBoard; wandb=True also logs them to Weights &
    # Biases (pip install -e .[wandb]; WANDB_MODE=offline keeps the run on disk).
    c.logging = ml_collections.ConfigDict(dict(wandb=False, wandb_project="spade_jax",
                                               wandb_entity=""))
    c.lock()
    return c
