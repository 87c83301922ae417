"""Typed run configuration: the defaults every `configs/*.py` starts from, and start-up checks.

Configs are `ml_collections.ConfigDict`s returned by `get_config()` and read by absl's
`config_flags`, so `--config.spade.plays_per_env=4` style overrides work on the command line.
`base_config()` is locked: a mistyped key fails at once instead of being silently ignored.
`validate()` turns impossible settings into messages that say what to change.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import ml_collections
import numpy as np

from spade_jax.errors import ConfigError
from spade_jax.models.config import ModelConfig
from spade_jax.seeding import check_seed

SKILLS = (
    "Mathematical_Reasoning",
    "Logical_Deduction",
    "Spatial_Reasoning",
    "Pattern_Recognition",
    "Optimization",
    "Causal_Inference",
)
REWARD_VARIANTS = ("regret", "blend", "solve_rate", "learning_potential")


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
    c.mode = "spade"  # spade | fixed (the paper's fixed-environment baseline)
    c.fixed_pool = "seeds"  # fixed mode: 'seeds' or a directory of environment .py files

    c.model = ml_collections.ConfigDict()
    # 'smollm2-135m-instruct', an HF directory, a .gguf file, or 'random' (built from arch).
    c.model.source = "random"
    c.model.tokenizer = "smollm2-135m-instruct"  # used when source is 'random'
    c.model.arch = arch()
    c.model.param_dtype = "float32"
    c.model.compute_dtype = "float32"

    c.mesh = ml_collections.ConfigDict(dict(data=1, fsdp=-1, tensor=1))  # -1: fill with devices

    c.sampling = ml_collections.ConfigDict()
    c.sampling.designer_temperature = 0.6
    c.sampling.agent_temperature = 0.6
    c.sampling.hint_temperature = 0.3
    c.sampling.top_p = 1.0
    c.sampling.top_k = 0
    c.sampling.designer_max_new_tokens = 16384
    c.sampling.agent_max_new_tokens = 8192  # per turn
    c.sampling.hint_max_new_tokens = 256
    c.sampling.max_context = 32768

    c.train = ml_collections.ConfigDict()
    c.train.learning_rate = 1e-6
    c.train.b1 = 0.9
    c.train.b2 = 0.98
    c.train.weight_decay = 0.1
    c.train.grad_clip = 1.0
    c.train.clip_low = 0.2
    c.train.clip_high = 0.28
    c.train.tis_cap = 2.0  # importance-weight truncation for delayed / off-policy samples
    c.train.kl_coef = 0.0
    c.train.remat = "block"  # none | block
    c.train.micro_batch = 8  # sequences per micro-batch (gradient accumulation is exact)
    c.train.seq_len = 32768  # longest trained sequence (memory plan)

    c.spade = ml_collections.ConfigDict()
    c.spade.skills = SKILLS
    c.spade.skills_per_regen = 3
    c.spade.regen_interval = 4
    c.spade.games_per_cycle = 24
    c.spade.plays_per_env = 8  # K no-hint plays; the same K with hint
    c.spade.max_turns = 25
    c.spade.max_attempts = 5
    c.spade.game_type = "game"  # game | tool_use
    c.spade.reward_variant = "blend"
    c.spade.penalize_invalid = True
    c.spade.hint_mode = "self"  # self | designer
    c.spade.designer_delay = 0  # 4 in the reference: cycles before Designer samples are trained
    # Delayed regret: hint plays against the regen cycle's no-hint plays (True), or against
    # every no-hint play of the delay window (False, the reference `regret` variant).
    c.spade.matched_timing = True
    c.spade.replay_per_cycle = 4  # memory environments replayed each cycle
    c.spade.no_corpus = False
    c.spade.no_memory = False
    c.spade.no_designer_training = False
    c.spade.step_timeout_s = 2.0

    c.memory = ml_collections.ConfigDict(dict(capacity=200, mode="plr", staleness_coef=0.3))
    c.corpus = ml_collections.ConfigDict(dict(source="stdlib", max_words=6000, data_dir=""))

    c.sandbox = ml_collections.ConfigDict(dict(allow_unsafe=False, warm_workers=8))

    c.checkpoint_every = 1
    c.keep_checkpoints = 3
    c.log_every = 1
    # In-loop evaluation every `every` cycles (0: off) on a fixed subset: `limit` items per suite
    # (spade_jax.eval.runner.SUITE_NAMES); `games` is 'seeds' or a directory of env files.
    c.eval = ml_collections.ConfigDict(dict(every=0, suites="games", limit=8, games="seeds"))
    c.lock()
    return c


CONFIGS_DIR = Path(__file__).resolve().parents[1] / "configs"


def load_config_file(path_or_name: str | Path) -> ml_collections.ConfigDict:
    """`get_config()` of a config file: a path, or a name of this checkout's configs/ ('tiny').

    What `--config=configs/X.py` does for launch/train.py, for scripts, benches and tests.
    """
    path = Path(path_or_name)
    if not path.suffix:
        path = CONFIGS_DIR / f"{path_or_name}.py"
    if not path.is_file():
        raise FileNotFoundError(f"config file {path} not found (use a path or a name in "
                                f"{CONFIGS_DIR})")
    spec = importlib.util.spec_from_file_location(f"spade_config_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.get_config()


def model_config(cfg: ml_collections.ConfigDict) -> ModelConfig:
    """The ModelConfig described by `cfg.model.arch`."""
    return ModelConfig(**cfg.model.arch.to_dict())


def mesh_shape(cfg: ml_collections.ConfigDict, n_devices: int) -> tuple[int, int, int]:
    """(data, fsdp, tensor) with a single -1 filled from the device count."""
    dims = [int(cfg.mesh.data), int(cfg.mesh.fsdp), int(cfg.mesh.tensor)]
    if dims.count(-1) > 1:
        raise ValueError("at most one of mesh.data, mesh.fsdp, mesh.tensor may be -1")
    if -1 in dims:
        known = int(np.prod([d for d in dims if d != -1]))
        if n_devices % known:
            raise ValueError(
                f"{n_devices} devices cannot be split into mesh {tuple(dims)}: "
                f"make the fixed axes divide {n_devices}"
            )
        dims[dims.index(-1)] = n_devices // known
    if int(np.prod(dims)) != n_devices:
        raise ValueError(
            f"mesh {tuple(dims)} uses {int(np.prod(dims))} devices but {n_devices} are visible; "
            "set --config.mesh.fsdp=-1 to fill the mesh automatically"
        )
    return tuple(dims)


def rollout_batch(cfg: ml_collections.ConfigDict) -> int:
    """Conversations the sampler holds at once: every play of every environment of a cycle."""
    envs = cfg.spade.games_per_cycle + cfg.spade.replay_per_cycle
    return envs * cfg.spade.plays_per_env * 2


def context_len(cfg: ml_collections.ConfigDict) -> int:
    """Longest sequence the sampler must hold (prompt plus all turns), capped by max_context."""
    return int(cfg.sampling.max_context)


def validate(cfg: ml_collections.ConfigDict, n_devices: int | None = None) -> None:
    """Raise ValueError listing every problem in `cfg` with what to change."""
    problems = []
    s = cfg.spade
    try:
        check_seed(cfg.seed)
    except ValueError as err:
        problems.append(str(err))
    if cfg.mode not in ("spade", "fixed"):
        problems.append(f"mode={cfg.mode!r}: use 'spade' or 'fixed'")
    if s.reward_variant not in REWARD_VARIANTS:
        problems.append(f"spade.reward_variant={s.reward_variant!r}: use one of {REWARD_VARIANTS}")
    unknown_skills = set(s.skills) - set(SKILLS)
    if unknown_skills:
        problems.append(f"spade.skills has unknown {sorted(unknown_skills)}; known: {SKILLS}")
    if not 1 <= s.skills_per_regen <= len(s.skills):
        problems.append(f"spade.skills_per_regen must be in 1..{len(s.skills)}")
    if s.designer_delay < 0:
        problems.append(f"spade.designer_delay={s.designer_delay} must be >= 0")
    for key in ("regen_interval", "games_per_cycle", "plays_per_env", "max_turns", "max_attempts"):
        if s[key] < 1:
            problems.append(f"spade.{key}={s[key]} must be >= 1")
    if s.hint_mode not in ("self", "designer"):
        problems.append(f"spade.hint_mode={s.hint_mode!r}: use 'self' or 'designer'")
    if s.game_type not in ("game", "tool_use"):
        problems.append(f"spade.game_type={s.game_type!r}: use 'game' or 'tool_use'")
    if cfg.memory.mode not in ("fifo", "plr"):
        problems.append(f"memory.mode={cfg.memory.mode!r}: use 'fifo' or 'plr'")
    if cfg.train.remat not in ("none", "block"):
        problems.append(f"train.remat={cfg.train.remat!r}: use 'none' or 'block'")
    if cfg.model.source == "random":
        try:
            model_config(cfg).validate()
        except (TypeError, ValueError) as err:
            problems.append(f"model.arch: {err}")
    if n_devices is not None:
        try:
            mesh_shape(cfg, n_devices)
        except ValueError as err:
            problems.append(str(err))
    if problems:
        raise ConfigError("invalid config:\n  - " + "\n  - ".join(problems))
