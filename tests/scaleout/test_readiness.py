"""30B-A3B readiness without the hardware: abstract state, lowering, CPU compile, memory plan."""

import os
import subprocess
import sys

import jax
import pytest

from spade_jax.config import load_config_file, parse
from spade_jax.plan import format_plan, memory_plan, plan_from_config, topology_devices
from spade_jax.readiness import lower_for_platform
from tests.scaleout.conftest import ROOT

TOPOLOGY = "v5p-64"  # 32 chips: mesh (data 1, fsdp 4, tensor 8) for configs/30b.py


def test_memory_plan_of_30b_on_v5p_64():
    cfg = parse(load_config_file("30b"))
    n_devices, hbm = topology_devices(TOPOLOGY)
    model_cfg, shape = plan_from_config(cfg, n_devices)
    plan = memory_plan(model_cfg, shape)
    text = format_plan(model_cfg, shape, plan, hbm)
    print(text)
    assert shape.mesh == (1, 4, 8)
    assert 30e9 < plan.n_params < 31e9  # Qwen3-30B-A3B: 30.5B
    assert plan.parameters + plan.optimizer + plan.gradients < hbm * (1 << 30)
    assert "verdict" in text


def test_full_depth_train_step_lowers_for_tpu_on_an_abstract_slice():
    """No 32 devices needed: the real shardings on an AbstractMesh, lowered for TPU."""
    report, text = lower_for_platform(parse(load_config_file("30b")), 32, platform="tpu",
                                      seq_len=256)
    assert report.name == "train_step[tpu]"
    assert '"fsdp"=4' in text and '"tensor"=8' in text, text[:2000]
    assert jax.device_count() == 8  # this process never needed the slice's devices


@pytest.mark.slow
def test_readiness_command_compiles_30b_at_two_layers_on_32_cpu_devices():
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    env.pop("XLA_FLAGS", None)  # the command re-executes itself with 32 CPU devices
    cmd = [sys.executable, "-m", "spade_jax.readiness", "--config=configs/30b.py",
           f"--topology={TOPOLOGY}", "--layers=2", "--seq_len=256", "--context=1024",
           "--rollout_batch=32"]
    result = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True,
                            timeout=1500)
    print(result.stdout)
    assert result.returncode == 0, result.stderr[-3000:]
    out = result.stdout
    assert "(32 devices, cpu backend)" in out
    assert "48 layers, 30.53B parameters" in out
    for program in ("train_step ", "sampler.extend", "sampler.decode"):
        assert program in out, program
    assert out.count("compiled OK") == 3, out
    assert "per device: arguments" in out
    assert out.rstrip().endswith("readiness: OK")
