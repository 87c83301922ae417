"""Memory plan: topology names, per-device bytes from real shardings, the CLI."""

import subprocess
import sys

import pytest

from spade_jax.errors import ConfigError
from spade_jax.models.config import ModelConfig
from spade_jax.plan import TrainShape, format_plan, memory_plan, topology_devices

CFG = ModelConfig(vocab_size=1024, d_model=256, n_layers=4, n_heads=8, n_kv_heads=4,
                  head_dim=32, ffn_dim=512, tie_embeddings=True, family="llama")
SHAPE = TrainShape(param_dtype="bfloat16", compute_dtype="bfloat16", mesh=(1, 4, 2),
                   remat="block", micro_batch=8, seq_len=128, rollout_batch=16, context_len=256)


def test_topologies():
    assert topology_devices("v5p-64") == (32, 95.0)
    assert topology_devices("v5e-16") == (16, 16.0)
    assert topology_devices("v6e-8") == (8, 32.0)
    with pytest.raises(ConfigError, match="unknown topology"):
        topology_devices("h100-8")


def test_parameter_bytes_follow_the_shardings():
    plan = memory_plan(CFG, SHAPE)
    # Every matrix here divides (fsdp=4, tensor=2); only norms [L, D] / [D] are replicated.
    norms = 2 * 4 * 256 + 256
    matrices = plan.n_params - norms
    assert plan.parameters == (matrices // 8 + norms) * 2
    assert plan.optimizer == 2 * (matrices // 8 + norms) * 4
    assert plan.gradients == plan.parameters
    # KV cache: 2 x [L=4, B=16/4, S=256, K=4/2, Dh=32] in bf16.
    assert plan.kv_cache == 2 * 4 * 4 * 256 * 2 * 32 * 2
    no_remat = memory_plan(CFG, TrainShape(**{**SHAPE.__dict__, "remat": "none"}))
    assert no_remat.activations > plan.activations
    assert "fits" in format_plan(CFG, SHAPE, plan, hbm_gib=16)
    assert "does NOT fit" in format_plan(CFG, SHAPE, plan, hbm_gib=1e-4)


def test_cli_prints_a_verdict():
    result = subprocess.run(
        [sys.executable, "-m", "spade_jax.plan", "--config=configs/30b.py", "--topology=v5p-64"],
        capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert "optimizer (AdamW)" in result.stdout and "verdict:" in result.stdout
