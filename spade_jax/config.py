"""Run configuration: loading a config file, and parsing it once into typed records.

Configs are `ml_collections.ConfigDict`s returned by `get_config()` (starting from
`spade_jax.defaults.base_config()`) and read by absl's `config_flags`, so
`--config.spade.plays_per_env=4` style overrides work on the command line. `parse()` turns one,
once at start-up, into a frozen `RunConfig` of typed records (the component ones live with
their component: `ModelConfig`, `TrainConfig`, `SandboxConfig`), and reports every impossible
setting at once, by key path, with what to change.
"""

from __future__ import annotations

import dataclasses
import enum
import importlib.util
import typing
from pathlib import Path

import ml_collections
import numpy as np

from spade_jax.envs.sandbox.isolation import SandboxConfig
from spade_jax.errors import ConfigError
from spade_jax.models.attention import DECODE_QUERIES, AttentionKernel, DecodeAttention
from spade_jax.models.config import MODEL_OPTIONS, ModelConfig
from spade_jax.models.moe import MoeSharding
from spade_jax.rl.losses import LossAggregation
from spade_jax.rl.trainer import Remat, TrainConfig
from spade_jax.sampling.programs import MIN_BUCKET
from spade_jax.sampling.sampler import (
    DRAFT_TOKENS,
    PREFILL_TOKENS_PER_DEVICE,
    DecodeDots,
    DecodeWeights,
)
from spade_jax.sampling.sampling_fns import DEFAULT_MAX_TOP_K
from spade_jax.seeding import check_seed
from spade_jax.spade.batch import plays_to_fill
from spade_jax.spade.hints import HintMode, HintSchedule
from spade_jax.spade.memory import MemoryMode
from spade_jax.spade.prompts import GameType
from spade_jax.spade.rewards import (
    BlendParams,
    FailedPlays,
    LPUpdate,
    RewardVariant,
    RoleScaleCounts,
    StepErrors,
)
from spade_jax.spade.rollout import Decoding, conversation_capacity


class Mode(enum.StrEnum):
    """SPADE (Designer and Agent) or the paper's fixed-environment baseline (Agent only)."""

    SPADE = "spade"
    FIXED = "fixed"

    @property
    def designs(self) -> bool:
        return self is Mode.SPADE


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


def _choice(enum_cls, value, key: str, problems: list[str]):
    """`enum_cls(value)`, or None after noting the problem with the allowed values."""
    if value in tuple(enum_cls):
        return enum_cls(value)
    problems.append(f"{key}={value!r}: use one of {tuple(m.value for m in enum_cls)}")
    return None


_SCALAR_NAMES = {bool: "a bool", int: "an int", float: "a number", str: "a string"}


def _type_problems(record_cls, values: dict) -> list[str]:
    """`name=value must be an int` (a number, a bool, a string) for every value of a scalar field
    of `record_cls` that has the wrong type; bools are not taken for numbers."""
    out = []
    for name, hint in typing.get_type_hints(record_cls).items():
        if name not in values or hint not in _SCALAR_NAMES:
            continue
        value = values[name]
        allowed = (int, float) if hint is float else (hint,)
        if not isinstance(value, allowed) or (hint is not bool and isinstance(value, bool)):
            out.append(f"{name}={value!r} must be {_SCALAR_NAMES[hint]}")
    return out


COMPUTE_DTYPES = ("float32", "bfloat16")


@dataclasses.dataclass(frozen=True)
class PolicyConfig:
    """Where the policy comes from: a checkpoint `source` (or 'random' built from `arch`)."""

    source: str = "random"
    tokenizer: str = "smollm2-135m-instruct"  # used when source is 'random'
    arch: ModelConfig | None = None
    param_dtype: str = "float32"
    compute_dtype: str = "float32"
    # MODEL_OPTIONS, also set on `arch` by `parse` and on a checkpoint's architecture
    attention: AttentionKernel | None = AttentionKernel.AUTO
    decode_attention: DecodeAttention | None = DecodeAttention.AUTO
    moe_capacity_factor: float | None = None
    moe_sharding: MoeSharding | None = MoeSharding.FFN

    def problems(self) -> list[str]:
        out = []
        if self.param_dtype != "float32":
            out.append(f"param_dtype={self.param_dtype!r}: the master weights must be 'float32' "
                       "(AdamW's lr-1e-6 updates vanish in a bf16 weight); set "
                       "compute_dtype='bfloat16' for bf16 matmuls")
        if self.compute_dtype not in COMPUTE_DTYPES:
            out.append(f"compute_dtype={self.compute_dtype!r}: use one of {COMPUTE_DTYPES}")
        if self.moe_capacity_factor is not None and not self.moe_capacity_factor > 0:
            out.append(f"moe_capacity_factor={self.moe_capacity_factor!r} must be > 0 (or None "
                       "for dropless experts)")
        if self.source != "random" or self.arch is None:  # None: arch's problems already noted
            return out
        try:
            self.arch.validate()
        except (TypeError, ValueError) as err:
            return [*out, f"arch: {err}"]
        return out


@dataclasses.dataclass(frozen=True)
class MeshConfig:
    """Device mesh axes; one of them may be -1 (filled with the devices left)."""

    data: int = 1
    fsdp: int = -1
    tensor: int = 1

    def problems(self) -> list[str]:
        return [f"{axis}={size} must be >= 1, or -1 to fill with the devices left"
                for axis, size in dataclasses.asdict(self).items() if size < 1 and size != -1]

    def shape(self, n_devices: int) -> tuple[int, int, int]:
        """(data, fsdp, tensor) with a single -1 filled from the device count."""
        dims = [int(self.data), int(self.fsdp), int(self.tensor)]
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
                f"mesh {tuple(dims)} uses {int(np.prod(dims))} devices but {n_devices} are "
                "visible; set --config.mesh.fsdp=-1 to fill the mesh automatically"
            )
        return tuple(dims)


ROLES = ("designer", "agent", "hint", "validator")


@dataclasses.dataclass(frozen=True)
class SamplingConfig:
    """Temperature, top-p, top-k and token budget of each kind of generation (role)."""

    designer_temperature: float = 0.6
    designer_top_p: float = 0.95
    designer_top_k: int = 20
    designer_max_new_tokens: int = 16384
    agent_temperature: float = 0.6
    agent_top_p: float = 0.95
    agent_top_k: int = 20
    agent_max_new_tokens: int = 8192  # per turn
    hint_temperature: float = 0.3
    hint_top_p: float = 0.9
    hint_top_k: int = 0
    hint_max_new_tokens: int = 4096
    validator_temperature: float = 0.3
    validator_top_p: float = 0.9
    validator_top_k: int = 0
    validator_max_new_tokens: int = 16384
    max_context: int = 32768
    prefill_tokens: int = PREFILL_TOKENS_PER_DEVICE
    cpu_decode_dots: DecodeDots | None = DecodeDots.YNNPACK
    decode_weights: DecodeWeights | None = DecodeWeights.RESIDENT
    draft_tokens: int = DRAFT_TOKENS

    def sampler_options(self) -> dict:
        """The `Sampler` keyword arguments this section sets."""
        return dict(prefill_tokens=self.prefill_tokens, decode_dots=self.cpu_decode_dots,
                    decode_weights=self.decode_weights, draft_tokens=self.draft_tokens)

    def decoding(self, role: str) -> Decoding:
        """The sampler settings of `role` ('designer', 'agent', 'hint' or 'validator')."""
        if role not in ROLES:
            raise ValueError(f"unknown sampling role {role!r}; use one of {ROLES}")
        return Decoding(*(getattr(self, f"{role}_{k}") for k in
                          ("temperature", "top_p", "top_k", "max_new_tokens")))

    @property
    def designer(self) -> Decoding:
        return self.decoding("designer")

    @property
    def agent(self) -> Decoding:
        return self.decoding("agent")

    @property
    def hint(self) -> Decoding:
        return self.decoding("hint")

    @property
    def validator(self) -> Decoding:
        return self.decoding("validator")

    def problems(self) -> list[str]:
        keys = [f"{r}_max_new_tokens" for r in ROLES] + ["max_context"]
        out = [f"{k}={getattr(self, k)} must be >= 1" for k in keys if getattr(self, k) < 1]
        if self.prefill_tokens < MIN_BUCKET:
            out.append(f"prefill_tokens={self.prefill_tokens} must be >= {MIN_BUCKET} (the "
                       "narrowest extend)")
        if not 0 <= self.draft_tokens < DECODE_QUERIES:
            out.append(f"draft_tokens={self.draft_tokens} must be in 0..{DECODE_QUERIES - 1} "
                       "(0: no drafts)")
        for role in ROLES:
            temperature = getattr(self, f"{role}_temperature")
            if temperature < 0:
                out.append(f"{role}_temperature={temperature} must be >= 0 (0: greedy)")
            top_p, top_k = getattr(self, f"{role}_top_p"), getattr(self, f"{role}_top_k")
            if not 0.0 < top_p <= 1.0:
                out.append(f"{role}_top_p={top_p} must be in (0, 1]")
            if not 0 <= top_k <= DEFAULT_MAX_TOP_K:
                out.append(f"{role}_top_k={top_k} must be in 0..{DEFAULT_MAX_TOP_K} (0: off)")
        return out


@dataclasses.dataclass(frozen=True)
class SpadeConfig:
    """The SPADE cycle: what the Designer is asked for, how often, and how it is rewarded.

    `parse` leaves an enum field None when its value was refused (and reported), and fills an
    empty `skills` with every skill of `game_type`.
    """

    skills: tuple[str, ...]
    skills_per_regen: int
    regen_interval: int
    games_per_cycle: int
    plays_per_env: int  # K no-hint plays
    hint_plays_per_env: int
    hint_plays_when: HintSchedule
    failed_plays: FailedPlays
    max_turns: int
    max_attempts: int
    game_type: GameType
    reward_variant: RewardVariant
    penalize_invalid: bool
    hint_mode: HintMode
    designer_delay: int
    final_flush: bool
    lp_update: LPUpdate
    role_scale_counts: RoleScaleCounts
    blend: BlendParams | None
    matched_timing: bool
    replay_per_cycle: int
    no_corpus: bool
    no_memory: bool
    no_designer_training: bool
    self_validation: bool = False  # a default: config.json of earlier runs has no such key
    global_batch_size: int = 192  # likewise
    compact_filter: bool = False  # likewise
    fill_batch: bool = False  # likewise (False: how those runs played)
    top_up: bool = False  # likewise
    step_errors: StepErrors = StepErrors.FAIL  # likewise
    cut_reply_truncates: bool = False  # likewise
    game_turns: bool = False  # likewise
    keep_blacklist: bool = True  # likewise (True: how those runs played)
    keep_last_pool: bool = True  # likewise

    def no_hint_plays(self, n_envs: int) -> int:
        """K of a cycle that plays `n_envs` environments: `plays_per_env`, raised with
        `fill_batch` so that the no-hint plays fill `global_batch_size`."""
        if not self.fill_batch:
            return self.plays_per_env
        return plays_to_fill(n_envs, self.plays_per_env, self.global_batch_size)

    def problems(self) -> list[str]:
        out = []
        known = tuple(self.game_type.skills) if self.game_type is not None else None
        unknown = [k for k in self.skills if known is not None and k not in known]
        if unknown:
            out.append(f"skills has unknown {sorted(unknown)} for game_type="
                       f"{self.game_type.value!r}; known: {known}")
        if self.skills and not 1 <= self.skills_per_regen <= len(self.skills):
            out.append(f"skills_per_regen={self.skills_per_regen} must be in "
                       f"1..{len(self.skills)}")
        if self.designer_delay < 0:
            out.append(f"designer_delay={self.designer_delay} must be >= 0")
        if self.global_batch_size < 0:
            out.append(f"global_batch_size={self.global_batch_size} must be >= 0 (0: no limit)")
        for key in ("regen_interval", "games_per_cycle", "plays_per_env", "hint_plays_per_env",
                    "max_turns", "max_attempts"):
            if getattr(self, key) < 1:
                out.append(f"{key}={getattr(self, key)} must be >= 1")
        return out


@dataclasses.dataclass(frozen=True)
class MemoryConfig:
    """The environment memory (spade/memory.py): its size and eviction mode."""

    capacity: int = 200
    mode: MemoryMode = MemoryMode.FIFO
    staleness_coef: float = 0.3

    def problems(self) -> list[str]:
        out = [] if self.capacity >= 1 else [f"capacity={self.capacity} must be >= 1"]
        if not 0.0 <= self.staleness_coef <= 1.0:
            out.append(f"staleness_coef={self.staleness_coef} must be in [0, 1]")
        return out


@dataclasses.dataclass(frozen=True)
class CorpusConfig:
    """The documents that ground the Designer's environments (spade/corpus.py)."""

    source: str = "stdlib"
    max_words: int = 6000
    data_dir: str = ""

    def problems(self) -> list[str]:
        return [] if self.max_words >= 1 else [f"max_words={self.max_words} must be >= 1"]


@dataclasses.dataclass(frozen=True)
class EvalConfig:
    """In-loop evaluation every `every` cycles (0: off) on `limit` items per suite."""

    every: int = 0
    suites: str = "games"
    limit: int = 8
    games: str = "seeds"

    def problems(self) -> list[str]:
        return [f"{key}={value} must be >= 0{note}" for key, value, note in
                (("every", self.every, " (0: off)"), ("limit", self.limit, "")) if value < 0]


@dataclasses.dataclass(frozen=True)
class LoggingConfig:
    """Where metrics go besides metrics.jsonl and TensorBoard: Weights & Biases when `wandb`."""

    wandb: bool = False
    wandb_project: str = "spade_jax"
    wandb_entity: str = ""  # "": the account's default entity

    def problems(self) -> list[str]:
        return [] if self.wandb_project else ["wandb_project must not be empty"]


@dataclasses.dataclass(frozen=True)
class RunConfig:
    """Everything a run needs, typed and checked; built once by `parse`."""

    seed: int
    total_cycles: int
    mode: Mode
    fixed_pool: str
    model: PolicyConfig
    mesh: MeshConfig
    sampling: SamplingConfig
    train: TrainConfig
    spade: SpadeConfig
    memory: MemoryConfig
    corpus: CorpusConfig
    sandbox: SandboxConfig
    checkpoint_every: int
    keep_checkpoints: int
    eval: EvalConfig
    logging: LoggingConfig = LoggingConfig()

    @property
    def rollout_batch(self) -> int:
        """Conversations the sampler holds at once: every play of every environment of the
        largest cycle (with `spade.fill_batch`, fewer environments may each play more)."""
        s = self.spade
        return max(n * (s.no_hint_plays(n) + s.hint_plays_per_env)
                   for n in range(1, s.games_per_cycle + s.replay_per_cycle + 1))

    @property
    def play_context(self) -> int:
        """KV-cache length of one Agent conversation (`rollout.conversation_capacity`)."""
        smp = self.sampling
        return conversation_capacity(self.spade.max_turns, smp.agent_max_new_tokens,
                                     smp.max_context)


def _section(record_cls, values: dict, key: str, problems: list[str]):
    """`record_cls(**values)` with its own `problems()` noted under `key`; None (after noting
    why) if a value has the wrong type or the record cannot be built."""
    wrong_types = _type_problems(record_cls, values)
    if wrong_types:
        problems += [f"{key}.{p}" for p in wrong_types]
        return None
    try:
        record = record_cls(**values)
    except (TypeError, ValueError) as err:
        problems.append(f"{key}: {err}")
        return None
    problems += [f"{key}.{p}" for p in getattr(record, "problems", list)()]
    return record


def default_skills(skills, game_type: GameType | None) -> tuple[str, ...]:
    """`skills` as a tuple; when empty, every skill of `game_type` (none if it was refused)."""
    if skills:
        return tuple(skills)
    return tuple(game_type.skills) if game_type is not None else ()


def parse(cfg: ml_collections.ConfigDict, n_devices: int | None = None) -> RunConfig:
    """The typed `RunConfig` of `cfg`; a ConfigError listing every problem, by key path.

    Every record that can be built is built and checked (a refused enum value leaves its field
    None), so one error reports all the problems at once.
    """
    problems: list[str] = []
    c = cfg.to_dict()
    seed = c["seed"]
    try:
        check_seed(seed)
    except ValueError as err:
        problems.append(str(err))
    mode = _choice(Mode, c["mode"], "mode", problems)
    model = dict(c["model"], arch=_section(ModelConfig, c["model"]["arch"], "model.arch",
                                           problems))
    model.setdefault("compute_dtype", model["param_dtype"])
    choices = (("attention", AttentionKernel), ("decode_attention", DecodeAttention),
               ("moe_sharding", MoeSharding))
    for key, kind in choices:
        model[key] = _choice(kind, model[key], f"model.{key}", problems)
    if model["arch"] is not None and all(model[key] is not None for key, _ in choices):
        model["arch"] = model["arch"].with_options({name: model[name] for name in MODEL_OPTIONS})
    t = dict(c["train"], tis_cap=c["train"]["tis_cap"] or None)
    t["remat"] = _choice(Remat, t["remat"], "train.remat", problems)
    t["loss_aggregation"] = _choice(LossAggregation, t["loss_aggregation"],
                                    "train.loss_aggregation", problems)
    s = dict(c["spade"])
    s["game_type"] = _choice(GameType, s["game_type"], "spade.game_type", problems)
    s["skills"] = default_skills(s["skills"], s["game_type"])
    s["reward_variant"] = _choice(RewardVariant, s["reward_variant"], "spade.reward_variant",
                                  problems)
    s["hint_mode"] = _choice(HintMode, s["hint_mode"], "spade.hint_mode", problems)
    s["hint_plays_when"] = _choice(HintSchedule, s["hint_plays_when"], "spade.hint_plays_when",
                                   problems)
    s["failed_plays"] = _choice(FailedPlays, s["failed_plays"], "spade.failed_plays", problems)
    s["step_errors"] = _choice(StepErrors, s["step_errors"], "spade.step_errors", problems)
    s["lp_update"] = _choice(LPUpdate, s["lp_update"], "spade.lp_update", problems)
    s["role_scale_counts"] = _choice(RoleScaleCounts, s["role_scale_counts"],
                                     "spade.role_scale_counts", problems)
    s["blend"] = _section(BlendParams, s["blend"], "spade.blend", problems)
    sampling = dict(c["sampling"])
    sampling["cpu_decode_dots"] = _choice(DecodeDots, sampling["cpu_decode_dots"],
                                          "sampling.cpu_decode_dots", problems)
    sampling["decode_weights"] = _choice(DecodeWeights, sampling["decode_weights"],
                                         "sampling.decode_weights", problems)
    memory = dict(c["memory"])
    memory["mode"] = _choice(MemoryMode, memory["mode"], "memory.mode", problems)
    for key, least in (("total_cycles", 0), ("checkpoint_every", 1), ("keep_checkpoints", 1)):
        if c[key] < least:
            problems.append(f"{key}={c[key]} must be >= {least}")
    mesh = _section(MeshConfig, c["mesh"], "mesh", problems)
    if mesh is not None and not mesh.problems() and n_devices is not None:
        try:
            mesh.shape(n_devices)
        except ValueError as err:
            problems.append(str(err))
    run = RunConfig(
        seed=seed, total_cycles=c["total_cycles"], mode=mode, fixed_pool=c["fixed_pool"],
        model=_section(PolicyConfig, model, "model", problems), mesh=mesh,
        sampling=_section(SamplingConfig, sampling, "sampling", problems),
        train=_section(TrainConfig, t, "train", problems),
        spade=_section(SpadeConfig, s, "spade", problems),
        memory=_section(MemoryConfig, memory, "memory", problems),
        corpus=_section(CorpusConfig, c["corpus"], "corpus", problems),
        sandbox=_section(SandboxConfig, c["sandbox"], "sandbox", problems),
        checkpoint_every=c["checkpoint_every"], keep_checkpoints=c["keep_checkpoints"],
        eval=_section(EvalConfig, c["eval"], "eval", problems),
        logging=_section(LoggingConfig, c["logging"], "logging", problems))
    if problems:
        raise ConfigError("invalid config:\n  - " + "\n  - ".join(problems))
    return run
