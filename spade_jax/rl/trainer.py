"""The jitted PPO train step: chunked log-probs, PPO-clip loss, exact gradient accumulation.

    optimizer = make_optimizer(TrainConfig(learning_rate=1e-6))
    state = init_train_state(model, optimizer, mesh)
    step = TrainStep(model.cfg, optimizer, mesh, TrainConfig(), micro_batches=2)
    state, metrics = step(state, batch)      # state is donated
    step.lower(abstract_state, abstract_batch).compile()   # AOT, e.g. spade_jax.readiness

batch: tokens [B, T] int32, loss_mask [B, T], advantages [B] or [B, T], old_logp [B, T],
optionally mask [B, T] (real tokens; default all), behaviour_logp (with tis_cap) and ref_logp
(with kl_coef). B must divide into `micro_batches` (a count; `TrainConfig.micro_batch` is
sequences per micro-batch) and each micro-batch over the data axes.
Micro-batches run in a `lax.scan`; their (loss sum, token count) and gradient sums are added
and divided once, so k micro-batches give the same update as one batch.
"""

from __future__ import annotations

import dataclasses
import enum

import flax.nnx as nnx
import jax
import jax.numpy as jnp
import optax
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from spade_jax.models.config import ModelConfig
from spade_jax.models.transformer import Transformer
from spade_jax.rl.logprobs import token_logprobs
from spade_jax.rl.losses import ppo_clip_loss
from spade_jax.sharding import param_shardings, traced_in_mesh

_BATCH_AXES = ("data", "fsdp")


class Remat(enum.StrEnum):
    """Rematerialisation in the backward pass: none, or recompute each transformer block."""

    NONE = "none"
    BLOCK = "block"

    @property
    def recompute_layers(self) -> bool:
        return self is Remat.BLOCK


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """Optimiser, loss and batch settings, the run config's `train` block (docs/DESIGN.md §4.7).

    `tis_cap` None turns importance-weight truncation off (0 in a config file).
    """

    learning_rate: float = 1e-6
    b1: float = 0.9
    b2: float = 0.98
    weight_decay: float = 0.1
    grad_clip: float = 1.0
    clip_low: float = 0.2
    clip_high: float = 0.28
    tis_cap: float | None = None
    kl_coef: float = 0.0
    logprob_chunk: int = 256
    remat: Remat = Remat.NONE
    micro_batch: int = 8  # sequences per micro-batch (gradient accumulation is exact)
    seq_len: int = 32768  # longest trained sequence

    def problems(self) -> list[str]:
        """What is wrong with these settings, one message per problem (key names as in config)."""
        out = []
        if self.remat is not None and self.remat not in tuple(Remat):  # None: parse refused it
            out.append(f"remat={self.remat!r}: use one of {tuple(Remat)}")
        for key in ("micro_batch", "seq_len", "logprob_chunk"):
            if getattr(self, key) < 1:
                out.append(f"{key}={getattr(self, key)} must be >= 1")
        if self.learning_rate < 0 or self.grad_clip <= 0:
            out.append(f"learning_rate={self.learning_rate} must be >= 0 and grad_clip="
                       f"{self.grad_clip} > 0")
        return out


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class TrainState:
    params: nnx.State
    opt_state: optax.OptState
    step: jax.Array


def make_optimizer(config: TrainConfig) -> optax.GradientTransformation:
    """Global-norm clipping then AdamW (weight decay on every parameter)."""
    return optax.chain(
        optax.clip_by_global_norm(config.grad_clip),
        optax.adamw(config.learning_rate, b1=config.b1, b2=config.b2,
                     weight_decay=config.weight_decay),
    )


def _abstract_split(model_cfg: ModelConfig):
    return nnx.split(nnx.eval_shape(lambda: Transformer(model_cfg, rngs=nnx.Rngs(0))))


def state_shardings(model_cfg: ModelConfig, optimizer, mesh: Mesh) -> TrainState:
    """Shardings of a TrainState: params by their specs, Adam moments like their params."""
    _, abstract_params = _abstract_split(model_cfg)
    params_sh = param_shardings(abstract_params, mesh)
    abstract_opt = jax.eval_shape(optimizer.init, abstract_params)
    by_shape = {}
    for value, sharding in zip(jax.tree.leaves(abstract_params), jax.tree.leaves(params_sh),
                               strict=True):
        by_shape.setdefault(value.shape, sharding)
    replicated = NamedSharding(mesh, PartitionSpec())
    opt_sh = jax.tree.map(lambda a: by_shape.get(a.shape, replicated) if a.ndim else replicated,
                          abstract_opt)
    return TrainState(params=params_sh, opt_state=opt_sh, step=replicated)


def init_train_state(model: Transformer, optimizer, mesh: Mesh) -> TrainState:
    """A TrainState for `model`'s weights, placed on `mesh`."""
    shardings = state_shardings(model.cfg, optimizer, mesh)
    params = jax.device_put(nnx.state(model), shardings.params)
    init = jax.jit(optimizer.init, out_shardings=shardings.opt_state)
    return TrainState(params, init(params), jax.device_put(jnp.int32(0), shardings.step))


def _micro_loss(graphdef, config: TrainConfig, params, micro):
    model = nnx.merge(graphdef, params)
    logp = token_logprobs(model, micro["tokens"], micro.get("mask"),
                          chunk_size=config.logprob_chunk,
                          remat=Remat(config.remat).recompute_layers)
    loss_sum, count, metrics = ppo_clip_loss(
        logp, micro["old_logp"], micro["advantages"], micro["loss_mask"],
        clip_low=config.clip_low, clip_high=config.clip_high,
        behaviour_logp=micro.get("behaviour_logp"), tis_cap=config.tis_cap,
        ref_logp=micro.get("ref_logp"), kl_coef=config.kl_coef,
    )
    return loss_sum, (count, metrics)


class TrainStep:
    """The jitted `step(state, batch) -> (state, metrics)` with explicit shardings; donates state.

    `step` and `step.lower` split the batch into `micro_batches` micro-batches.

    metrics: loss (token-mean), tokens, clip_fraction, ratio, approx_kl (token means),
    grad_norm (before clipping). `grouped(state, [(batch, micro_batches), ...])` is one
    optimizer step over several batches of different lengths (RL batches mix 4k-token Designer
    samples with short Agent episodes: each group is padded to its own length, not the
    longest), with the same exact (sum, count) accumulation.

    `skipped_tokens`: generated tokens of samples left out of the batch because their
    advantage is 0. With no KL term their loss and gradient are exactly 0, so leaving them out
    changes nothing but the work, provided they still count in the token-mean's denominator
    (loss, gradient). The ratio / clip / KL metrics are means over the tokens computed.
    """

    def __init__(self, model_cfg: ModelConfig, optimizer, mesh: Mesh,
                 config: TrainConfig = TrainConfig(), micro_batches: int = 1):
        self.config = config
        self.micro_batches = micro_batches
        self.optimizer = optimizer
        self.mesh = mesh
        self.graphdef, _ = _abstract_split(model_cfg)
        self.shardings = state_shardings(model_cfg, optimizer, mesh)
        self.replicated = NamedSharding(mesh, PartitionSpec())
        self._jitted: dict = {}
        self._add_sums = jax.jit(lambda a, b: jax.tree.map(jnp.add, a, b), donate_argnums=(0,))
        self._apply_sums = jax.jit(self._apply, donate_argnums=(0,),
                                   out_shardings=(self.shardings, self.replicated))

    def _loss(self, params, micro):
        return traced_in_mesh(_micro_loss, self.mesh)(self.graphdef, self.config, params, micro)

    def _batch_sharding(self, a) -> NamedSharding:
        return NamedSharding(self.mesh, PartitionSpec(_BATCH_AXES, *[None] * (a.ndim - 1)))

    def _gradient_sums(self, params, batch: dict, m: int):
        """(grad sums, loss sum, token count, metric sums) over `m` micro-batches of `batch`."""
        micro_sharding = NamedSharding(self.mesh, PartitionSpec(None, _BATCH_AXES))
        micro = jax.tree.map(
            lambda a: jax.lax.with_sharding_constraint(
                a.reshape(m, a.shape[0] // m, *a.shape[1:]),
                NamedSharding(self.mesh, PartitionSpec(None, _BATCH_AXES, *[None] * (a.ndim - 1)))
                if a.ndim > 1 else micro_sharding),
            batch)

        def accumulate(carry, mb):
            grads, loss_sum, count, metrics = carry
            (value, (n, mets)), g = jax.value_and_grad(self._loss, has_aux=True)(params, mb)
            grads = jax.tree.map(jnp.add, grads, g)
            metrics = jax.tree.map(jnp.add, metrics, mets)
            return (grads, loss_sum + value, count + n, metrics), None

        zero_grads = jax.tree.map(jnp.zeros_like, params)
        _, (_, zero_metrics) = jax.eval_shape(self._loss, params,
                                              jax.tree.map(lambda a: a[0], micro))
        zero_metrics = jax.tree.map(lambda a: jnp.zeros(a.shape, a.dtype), zero_metrics)
        init = (zero_grads, jnp.float32(0), jnp.float32(0), zero_metrics)
        sums, _ = jax.lax.scan(accumulate, init, micro)
        return sums

    def _apply(self, state: TrainState, sums, skipped_tokens):
        """Divide the sums once and take the optimizer step."""
        grads, loss_sum, count, metrics = sums
        denom = jnp.maximum(count + skipped_tokens, 1.0)
        grads = jax.tree.map(lambda g: g / denom, grads)
        updates, opt_state = self.optimizer.update(grads, state.opt_state, state.params)
        params = optax.apply_updates(state.params, updates)
        out = {k: v / jnp.maximum(count, 1.0) for k, v in metrics.items()}
        out.update(loss=loss_sum / denom, tokens=count + skipped_tokens,
                   skipped_tokens=skipped_tokens, grad_norm=optax.global_norm(grads))
        return TrainState(params, opt_state, state.step + 1), out

    def _jitted_for(self, kind: str, batch: dict, m: int):
        """The compiled 'step' (gradients and update) or 'grads' (sums only) for this shape."""
        key = (kind, m, tuple(sorted((k, v.shape, str(v.dtype)) for k, v in batch.items())))
        if key not in self._jitted:
            in_batch = {k: self._batch_sharding(v) for k, v in batch.items()}
            rep = self.replicated
            if kind == "step":
                self._jitted[key] = jax.jit(
                    lambda state, b, skipped: self._apply(
                        state, self._gradient_sums(state.params, b, m), skipped),
                    in_shardings=(self.shardings, in_batch, rep),
                    out_shardings=(self.shardings, rep), donate_argnums=(0,))
            else:
                self._jitted[key] = jax.jit(
                    lambda params, b: self._gradient_sums(params, b, m),
                    in_shardings=(self.shardings.params, in_batch),
                    out_shardings=(self.shardings.params, rep, rep, rep))
        return self._jitted[key]

    def _to_device(self, batch: dict) -> dict:
        """Host batch -> arrays split over the data axes. `device_put`, not `jnp.asarray`: it
        also builds global arrays from identical host data in a multi-process run."""
        return {k: jax.device_put(v, self._batch_sharding(v)) for k, v in batch.items()}

    def __call__(self, state: TrainState, batch: dict):
        batch = self._to_device(batch)
        return self._jitted_for("step", batch, self.micro_batches)(
            state, batch, jnp.float32(0))

    def grouped(self, state: TrainState, groups: list[tuple[dict, int]], skipped_tokens: int = 0):
        """One optimizer step over (batch, micro_batches) groups of different shapes."""
        if not groups:
            raise ValueError("grouped train step needs at least one batch")
        groups = [(self._to_device(b), m) for b, m in groups]
        skipped = jnp.float32(skipped_tokens)
        if len(groups) == 1:
            batch, m = groups[0]
            return self._jitted_for("step", batch, m)(state, batch, skipped)
        sums = None
        for batch, m in groups:
            part = self._jitted_for("grads", batch, m)(state.params, batch)
            sums = part if sums is None else self._add_sums(sums, part)
        return self._apply_sums(state, sums, skipped)

    def lower(self, state: TrainState, batch: dict, **lower_kwargs):
        """`jax.jit(...).lower` of the step for abstract (ShapeDtypeStruct) state and batch.

        `lower_kwargs` go to `Traced.lower`, e.g. lowering_platforms=('tpu',) on an AbstractMesh.
        """
        skipped = jax.ShapeDtypeStruct((), jnp.float32)
        return self._jitted_for("step", batch, self.micro_batches).trace(
            state, batch, skipped).lower(**lower_kwargs)
