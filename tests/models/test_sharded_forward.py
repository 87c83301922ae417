"""On 8 fake CPU devices, sharded forward passes equal the single-device one; specs are honoured."""

import jax
import numpy as np
import pytest
from jax.sharding import NamedSharding

from spade_jax.models.config import Family
from spade_jax.policy import Policy
from spade_jax.sharding import fit_spec, make_mesh
from spade_jax.weights import load_hf_model
from spade_jax.weights.tiny import write_tiny_checkpoint

pytest.importorskip("torch")
MESHES = [(1, 8, 1), (2, 2, 2), (1, 2, 4)]


@pytest.fixture(scope="module", params=[Family.LLAMA, Family.QWEN3_MOE])
def checkpoint(request, tmp_path_factory):
    return write_tiny_checkpoint(request.param, tmp_path_factory.mktemp(request.param))


@pytest.fixture(scope="module")
def tokens():
    return np.random.RandomState(0).randint(0, 128, (8, 12))


@pytest.fixture(scope="module")
def single_device_logits(checkpoint, tokens):
    model = load_hf_model(checkpoint)
    return np.asarray(Policy(model, None, make_mesh((1, 1, 1), jax.devices()[:1])).logits(tokens))


@pytest.mark.parametrize("shape", MESHES)
def test_sharded_forward_equals_single_device(checkpoint, tokens, single_device_logits, shape):
    assert len(jax.devices()) == 8, "tests/conftest.py must fake 8 CPU devices"
    mesh = make_mesh(shape)
    model = load_hf_model(checkpoint, mesh=mesh)
    for name, variable in vars(model).items():
        if not hasattr(variable, "get_metadata"):
            continue
        value = variable[...]
        spec = fit_spec(variable.get_metadata()["out_sharding"], value.shape, mesh)
        assert value.sharding == NamedSharding(mesh, spec), name
    logits = np.asarray(Policy(model, None, mesh).logits(tokens))
    np.testing.assert_allclose(logits, single_device_logits, atol=1e-5, rtol=0)
