"""`launch/export.py` turns a training checkpoint into an HF directory with the same logits."""

import os
import subprocess
import sys

import jax
import numpy as np
import pytest

from spade_jax import config as config_lib
from spade_jax.checkpoint import Checkpointer
from spade_jax.config import load_config_file
from spade_jax.policy import Policy
from spade_jax.readiness import abstract_train_state
from spade_jax.rl.trainer import TrainConfig, make_optimizer
from spade_jax.sharding import make_mesh
from tests.commands import one_device_xla_flags
from tests.scaleout.conftest import ROOT

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")


def trained_logits(workdir, tokens):
    """Our logits of `tokens` under the checkpoint's parameters (restored on one device)."""
    import flax.nnx as nnx

    model_cfg = config_lib.parse(load_config_file("tiny")).model.arch
    mesh = make_mesh((1, 1, 1), jax.devices()[:1])
    model, target = abstract_train_state(model_cfg, make_optimizer(TrainConfig()), mesh,
                                         "float32")
    ck = Checkpointer(str(workdir))
    state, _ = ck.restore(ck.latest_step(), target)
    ck.close()
    trained = nnx.merge(nnx.split(model)[0], state.params)
    return np.asarray(Policy(trained, None, mesh).logits(tokens))


@pytest.mark.slow
def test_export_loads_in_transformers_with_our_logits(tiny_workdir, tmp_path):
    out = tmp_path / "hf"
    env = dict(os.environ, XLA_FLAGS=one_device_xla_flags(), JAX_PLATFORMS="cpu")
    result = subprocess.run(
        [sys.executable, "launch/export.py", f"--checkpoint={tiny_workdir}/checkpoints/1",
         f"--out={out}"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    names = set(os.listdir(out))
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= names, names

    hf = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(out)
    text = "Design an environment where the agent balances a sum of numbers."
    tokens = np.asarray([tokenizer.encode(text)], np.int64)
    with torch.no_grad():
        theirs = hf(torch.from_numpy(tokens)).logits.numpy()
    ours = trained_logits(tiny_workdir, tokens.astype(np.int32))
    np.testing.assert_allclose(ours, theirs, atol=1e-4, rtol=0)


def test_checkpoint_paths_are_located_or_refused_by_name(tmp_path):
    import importlib.util

    from spade_jax.checkpoint import checkpoint_location
    from spade_jax.errors import MissingFileError

    spec = importlib.util.spec_from_file_location("export", ROOT / "launch" / "export.py")
    export = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(export)
    (tmp_path / "checkpoints" / "7").mkdir(parents=True)
    assert checkpoint_location(str(tmp_path)) == (tmp_path.resolve(), None)
    assert checkpoint_location(tmp_path / "checkpoints" / "7") == (tmp_path.resolve(), 7)
    with pytest.raises(MissingFileError, match="no checkpoints under"):
        checkpoint_location(str(tmp_path / "nope"))
    with pytest.raises(MissingFileError, match="no checkpoint directory"):
        checkpoint_location(str(tmp_path / "checkpoints" / "8"))
    with pytest.raises(MissingFileError, match="config.json"):
        export.read_run_config(checkpoint_location(tmp_path)[0])
