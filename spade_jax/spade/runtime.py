"""The runtime of a SPADE run: where device code (model, sampler, train step) meets host code
(sandboxed environments). `loop.py` only talks to a Runtime, so it stays free of JAX.

    rt = Runtime.create(run)          # run: the RunConfig (spade_jax.config.parse)
    rt.generate(messages_list, dec)   # one-shot generation (Designer code, self hints)
    rt.validate_many(texts)           # the validation gate, in the sandbox
    rt.play(specs, dec, seed=...)     # multi-turn Agent episodes on a live KV cache
    rt.train(samples)                 # one policy-gradient step on the shared weights
"""

from __future__ import annotations

import logging
import pathlib

import flax.nnx as nnx
import jax
import jax.numpy as jnp

from spade_jax.config import PolicyConfig, RunConfig
from spade_jax.distributed import assert_same_on_all_processes, map_over_processes, to_host
from spade_jax.envs import EnvPool, ValidationReport, validate
from spade_jax.envs.seeds import list_seed_envs
from spade_jax.errors import ConfigError, MissingFileError
from spade_jax.metrics import PhaseTimer
from spade_jax.models.config import MODEL_OPTIONS
from spade_jax.models.transformer import Transformer
from spade_jax.rl.trainer import TrainStep, compute_copy, init_train_state, make_optimizer
from spade_jax.sampling.engine import Engine, Request
from spade_jax.sampling.generate import Completion
from spade_jax.sampling.sampler import Sampler
from spade_jax.sharding import ResidentBytes, make_mesh
from spade_jax.spade.batch import (
    TrainSample,
    drop_zero_advantage,
    train_groups,
)
from spade_jax.spade.designer import DesignedEnv
from spade_jax.spade.envrunner import ENV_HINT, SandboxEnvRunner, ShardedEnvRunner
from spade_jax.spade.rollout import (
    ChatFormat,
    Decoding,
    EpisodeSpec,
    play_episodes,
)

log = logging.getLogger(__name__)


def load_model_and_tokenizer(model: PolicyConfig, seed: int, mesh):
    """The model and tokenizer `model` names (a checkpoint, or random weights from `seed`)."""
    from spade_jax.policy import load_policy, named_path
    from spade_jax.weights.tokenizer import load_tokenizer

    dtype = jnp.dtype(model.param_dtype)
    if model.source == "random":
        return (Transformer(model.arch, rngs=nnx.Rngs(seed), param_dtype=dtype),
                load_tokenizer(named_path(model.tokenizer)))
    policy = load_policy(model.source, mesh=mesh, dtype=dtype, options={
        name: getattr(model, name) for name in MODEL_OPTIONS})
    if policy.config != model.arch:
        log.warning("the checkpoint's architecture differs from config.model.arch; "
                    "using the checkpoint's: %s", policy.config)
    return policy.model, policy.tokenizer


def fixed_pool_files(source: str) -> list[pathlib.Path] | None:
    """The environment files of a `fixed_pool` directory (None for 'seeds' and
    'reasoning_gym[:CATS]'); a MissingFileError naming the choices if it holds none."""
    if source == "seeds" or source.startswith("reasoning_gym"):
        return None
    files = sorted(pathlib.Path(source).expanduser().glob("*.py"))
    if not files:
        raise MissingFileError(f"fixed_pool={source!r}: no .py environment files there; use "
                               "'seeds', 'reasoning_gym[:CATS]' or a directory of env files")
    return files


def fixed_pool_categories(source: str) -> tuple[str, ...] | None:
    """The categories of a 'reasoning_gym[:CAT,CAT]' fixed pool (None for other pools); a
    ConfigError if reasoning-gym is not installed or does not know a category."""
    if not source.startswith("reasoning_gym"):
        return None
    from spade_jax.eval.reasoning_gym import DEFAULT_CATEGORIES, unknown_categories

    names = source.partition(":")[2]
    categories = tuple(names.split(",")) if names else DEFAULT_CATEGORIES
    try:
        unknown = unknown_categories(categories)
    except ImportError as err:
        raise ConfigError(f"fixed_pool={source!r}: {err}") from err
    if unknown:
        raise ConfigError(f"fixed_pool={source!r}: unknown reasoning-gym categories {unknown}")
    return categories


class Runtime:
    """Model, sampler, optimizer state and sandbox pools of one run."""

    def __init__(self, run: RunConfig, model, tokenizer, mesh):
        self.run = run
        self.mesh = mesh
        self.model = model
        self.tokenizer = tokenizer
        self.chat = ChatFormat(tokenizer)
        self.game_type = run.spade.game_type
        self.seed_envs = list_seed_envs(tool_use=self.game_type.is_tool_use)
        self.train_config = run.train
        compute_dtype = jnp.dtype(run.model.compute_dtype)
        self.optimizer = make_optimizer(self.train_config)
        self.train_state = init_train_state(model, self.optimizer, mesh)
        # what stays in device memory through both phases: each phase's programs are compiled
        # for the rest (on TPU; the compiler would otherwise plan for the whole HBM)
        self.resident = ResidentBytes.of(self.train_state.params, self.train_state.opt_state,
                                         compute_dtype, kl=bool(self.train_config.kl_coef))
        self.train_step = TrainStep(model.cfg, self.optimizer, mesh, self.train_config,
                                    compute_dtype=compute_dtype,
                                    reserved_bytes=self.resident.beside_train_step)
        # KL's reference policy: the initial weights, frozen, in the compute dtype (a resumed
        # run rebuilds it from the same model.source before restoring the train state)
        self.reference_params = (
            compute_copy(self.train_state.params, compute_dtype,
                         self.train_step.shardings.params)
            if self.train_config.kl_coef else None)
        self.sampler = Sampler(model, mesh=mesh, compute_dtype=compute_dtype,
                               reserved_bytes=self.resident.beside_sampler,
                               **run.sampling.sampler_options())
        max_turns = run.spade.max_turns
        self.pool = EnvPool(run.sandbox, warm=run.sandbox.warm_workers, max_turns=max_turns,
                            game_turns=run.spade.game_turns)
        self.validation_pool = EnvPool(run.sandbox, warm=2, max_turns=max_turns)
        self.envs = SandboxEnvRunner(self.pool, max_turns)
        if jax.process_count() > 1:  # each host runs the environments of its own rows
            self.envs = ShardedEnvRunner(self.envs, jax.process_index(), jax.process_count())
        self.timer = PhaseTimer()
        self._generated_tokens = 0
        log.info("sandbox layers: %s", self.pool.layers)

    @classmethod
    def create(cls, run: RunConfig, devices=None) -> Runtime:
        """The model of `run` loaded onto a mesh of `devices` (default: every device)."""
        devices = jax.devices() if devices is None else list(devices)
        mesh = make_mesh(run.mesh.shape(len(devices)), devices)
        model, tokenizer = load_model_and_tokenizer(run.model, run.seed, mesh)
        return cls(run, model, tokenizer, mesh)

    # ------------------------------------------------------------------ generation and play
    def generate(self, messages_list, decoding: Decoding, *, seed: int) -> list[Completion]:
        """One answer per chat prompt, sampled with a role's `decoding` by an `Engine` with a
        slot per prompt (as the Agent's plays are)."""
        prompt_ids = [self.chat.prompt(m) for m in messages_list]
        capacity = max(len(p) for p in prompt_ids) + decoding.max_new_tokens + 1
        with self.timer.phase("sampling"):
            served = Engine(self.sampler, slots=len(prompt_ids), capacity=capacity).run(
                [Request(p, decoding.max_new_tokens) for p in prompt_ids],
                **decoding.decode_kwargs(), stop_token_ids=[self.chat.eos_id], seed=seed)
        outputs = [conversation.turns[0] for conversation in served]
        self._generated_tokens += sum(len(o.tokens) for o in outputs)
        return [Completion(self.tokenizer.decode(o.tokens, skip_special_tokens=True),
                           o.tokens, o.logprobs, o.finish_reason) for o in outputs]

    def validate(self, text: str) -> ValidationReport:
        """The validation gate on one Designer response, in this process's sandbox."""
        with self.timer.phase("env"):
            return validate(text, max_turns=self.run.spade.max_turns, pool=self.validation_pool,
                            tool_use=self.game_type.is_tool_use,
                            liveness_budget_s=self.run.sandbox.validation_timeout_s)

    def validate_many(self, texts: list[str]) -> list[ValidationReport]:
        """`validate` of every response, each run by one process and shared with all.

        Besides dividing the work, this keeps the hosts' decisions identical: the gate's
        liveness check has a time budget, so two hosts validating the same code could differ.
        """
        return map_over_processes(self.validate, texts, encode=ValidationReport.to_json,
                                  decode=ValidationReport.from_json)

    def play(self, specs: list[EpisodeSpec], decoding: Decoding, *, seed: int):
        """Multi-turn Agent episodes of `specs`, every turn sampled with `decoding`."""
        s = self.run.spade
        capacity = self.run.play_context
        episodes = play_episodes(
            specs, sampler=self.sampler, envs=self.envs, chat=self.chat,
            system_prompt=s.game_type.agent_system_prompt, max_turns=s.max_turns,
            decoding=decoding, seed=seed, capacity=capacity,
            step_wait_s=self.run.sandbox.step_wait_s, timer=self.timer,
            to_action=s.game_type.agent_action, step_error_reward=s.step_errors.reward)
        self._generated_tokens += sum(e.generated_tokens for e in episodes)
        return episodes

    def fixed_pool(self) -> list[DesignedEnv]:
        """The fixed-environment baseline pool (`run.fixed_pool`).

        'seeds': our seed environments; 'reasoning_gym[:CAT,CAT]': reasoning-gym tasks (one
        environment per category; each episode seed picks an item); otherwise a directory of
        environment .py files (e.g. the reference's released pool).
        """
        source = self.run.fixed_pool
        files = fixed_pool_files(source)
        if files is not None:
            items = [(f.stem, "Unknown", f.read_text()) for f in files]
        elif source == "seeds":
            items = [(e.name, e.skill, e.code) for e in self.seed_envs]
        else:
            from spade_jax.eval.reasoning_gym import reasoning_gym_tasks

            categories = fixed_pool_categories(source)
            tasks = reasoning_gym_tasks(categories, size=1000, dataset_seed=self.run.seed)
            first = {t.category: t for t in reversed(tasks)}
            items = [(f"rg_{c}", c, first[c].code) for c in categories]
        return [DesignedEnv(f"fixed:{name}", skill, code, None, 0, hint=ENV_HINT)
                for name, skill, code in items]

    # ------------------------------------------------------------------ training
    def train(self, samples: list[TrainSample]) -> dict[str, float]:
        """One optimizer step on `samples`: length groups, gradient accumulation, exact means.

        Each sample's sampler log-probs go to the batch as `behaviour_logp` (TIS); the PPO
        old_logp is the train step's own forward (one step per rollout, as the reference).
        """
        max_len = self.train_config.seq_len
        # without a KL term, zero-advantage samples have exactly zero loss and gradient
        computed, skipped_tokens, skipped_samples = (
            drop_zero_advantage(samples, max_len) if not self.train_config.kl_coef
            else (samples, 0, 0))
        groups = train_groups(computed, pad_id=0, max_len=max_len,
                              data_parallel=self.mesh.shape["data"] * self.mesh.shape["fsdp"],
                              micro_batch=self.train_config.micro_batch)
        assert_same_on_all_processes(
            {f"{i}/{k}": v for i, (batch, _) in enumerate(groups) for k, v in batch.items()},
            "the train batch")
        truncated = sum(len(s.tokens) > max_len for s in samples)
        if truncated:
            log.warning("%d samples longer than train.seq_len=%d were cut", truncated, max_len)
        log.info("train step: %d samples in %s (rows x tokens), %d with advantage 0 not "
                 "computed", len(samples), ", ".join(f"{b['tokens'].shape[0]}x"
                                                     f"{b['tokens'].shape[1]}" for b, _ in groups),
                 len(samples) - len(computed))
        with self.timer.phase("training"):
            self.train_state, metrics = self.train_step.grouped(
                self.train_state, groups, skipped_tokens, skipped_samples,
                reference=self.reference_params)
            metrics = {f"train/{k}": float(to_host(v)) for k, v in metrics.items()}
        metrics["train/truncated_samples"] = float(truncated)
        self._sync_weights()
        return metrics

    def _sync_weights(self) -> None:
        """Point the model at the new master weights and refresh the sampler's copy."""
        nnx.update(self.model, self.train_state.params)
        self.sampler.set_params(self.train_state.params)

    # ------------------------------------------------------------------ checkpoint support
    def device_state(self):
        return self.train_state

    def set_device_state(self, state) -> None:
        self.train_state = state
        self._sync_weights()

    def pop_tokens_per_second(self) -> float:
        """Generated tokens per second of sampling time since the last call."""
        seconds = self.timer.seconds.get("sampling", 0.0)
        rate = self._generated_tokens / seconds if seconds > 0 else 0.0
        self._generated_tokens = 0
        return float(rate)

    def log(self, message: str) -> None:
        log.warning(message)

    def close(self) -> None:
        self.pool.shutdown()
        self.validation_pool.shutdown()
