"""A checkpoint saved on mesh (1, 8, 1) restores bit-identically on (2, 2, 2) and (1, 2, 4)."""

import jax
import numpy as np
import pytest

from spade_jax import config as config_lib
from spade_jax.checkpoint import Checkpointer
from spade_jax.config import load_config_file
from spade_jax.models.config import ModelConfig
from spade_jax.readiness import abstract_train_state
from spade_jax.rl.trainer import (
    TrainConfig,
    TrainStep,
    init_train_state,
    make_optimizer,
)
from spade_jax.sharding import make_mesh

SAVED_ON = (1, 8, 1)
TARGETS = [(2, 2, 2), (1, 2, 4)]
# Dims divisible by 8 so every axis really shards; experts too (F=32 over 'tensor').
MOE = ModelConfig(vocab_size=256, d_model=64, n_layers=2, n_heads=8, n_kv_heads=4, head_dim=16,
                  ffn_dim=128, qk_norm=True, n_experts=8, n_experts_per_tok=2,
                  expert_ffn_dim=32, family="qwen3_moe")


def host_leaves(state):
    return [np.asarray(jax.device_get(x)) for x in jax.tree.leaves(state)]


def assert_restored(restored, target, expected):
    for got, want_sh, want in zip(jax.tree.leaves(restored), jax.tree.leaves(target),
                                  expected, strict=True):
        assert got.sharding.is_equivalent_to(want_sh.sharding, got.ndim), (
            got.sharding, want_sh.sharding)
        assert got.dtype == want.dtype and got.shape == want.shape
        assert np.array_equal(np.asarray(jax.device_get(got)), want)


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A trained (non-zero Adam moments) MoE TrainState checkpointed on mesh (1, 8, 1)."""
    import flax.nnx as nnx

    from spade_jax.models.transformer import Transformer

    mesh = make_mesh(SAVED_ON)
    optimizer = make_optimizer(TrainConfig(learning_rate=1e-2))
    state = init_train_state(Transformer(MOE, rngs=nnx.Rngs(0)), optimizer, mesh)
    rng = np.random.RandomState(0)
    batch = dict(tokens=rng.randint(0, 256, (8, 12)).astype(np.int32),
                 loss_mask=np.ones((8, 12), np.float32),
                 advantages=rng.randn(8).astype(np.float32),
                 behaviour_logp=np.full((8, 12), -5.0, np.float32))
    state, _ = TrainStep(MOE, optimizer, mesh, TrainConfig())(state, batch)
    expected = host_leaves(state)
    workdir = tmp_path_factory.mktemp("ckpt")
    ck = Checkpointer(str(workdir))
    ck.save(1, state, {"note": "saved on (1, 8, 1)"})
    ck.close()
    return workdir, optimizer, expected


@pytest.mark.parametrize("target_shape", TARGETS)
def test_train_state_restores_on_another_mesh(saved, target_shape):
    workdir, optimizer, expected = saved
    _, target = abstract_train_state(MOE, optimizer, make_mesh(target_shape), "float32")
    ck = Checkpointer(str(workdir))
    restored, host = ck.restore(1, target)
    ck.close()
    assert host == {"note": "saved on (1, 8, 1)"}
    assert_restored(restored, target, expected)
    # The experts really are split differently: their 32 hidden columns (model.moe_sharding's
    # default, ffn) over tensor=2 or 4.
    w_gate = restored.params["w_gate"]
    w_gate = jax.tree.leaves(w_gate)[0]
    assert w_gate.shape[-1] == MOE.expert_ffn_dim
    assert w_gate.sharding.shard_shape(w_gate.shape)[-1] == MOE.expert_ffn_dim // target_shape[2]


@pytest.mark.slow
@pytest.mark.parametrize("target_shape", TARGETS)
def test_training_run_checkpoint_restores_on_another_mesh(tiny_workdir, target_shape):
    cfg = load_config_file("tiny")
    model_cfg = config_lib.parse(cfg).model.arch
    optimizer = make_optimizer(TrainConfig())
    ck = Checkpointer(str(tiny_workdir))
    step = ck.latest_step()
    assert step == 1
    _, on_saved_mesh = abstract_train_state(model_cfg, optimizer, make_mesh(SAVED_ON), "float32")
    reference, host = ck.restore(step, on_saved_mesh)
    _, target = abstract_train_state(model_cfg, optimizer, make_mesh(target_shape), "float32")
    restored, host_again = ck.restore(step, target)
    ck.close()
    assert host_again == host and host["state"]["cycle"] == 1
    assert_restored(restored, target, host_leaves(reference))
    assert int(restored.step) == 1
