"""HF safetensors import -> export -> transformers round trip; clear errors on bad checkpoints."""

import json
import shutil

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from spade_jax.errors import CheckpointError, MissingFileError, SpadeError  # noqa: E402
from spade_jax.models.config import Family  # noqa: E402
from spade_jax.models.transformer import forward_logits  # noqa: E402
from spade_jax.weights import load_hf_model, save_hf  # noqa: E402
from spade_jax.weights.tiny import TINY_FAMILIES, write_tiny_checkpoint  # noqa: E402


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory):
    return write_tiny_checkpoint(Family.LLAMA, tmp_path_factory.mktemp("llama"))


@pytest.mark.parametrize("family", TINY_FAMILIES)
def test_export_loads_in_transformers_with_same_logits(family, tmp_path):
    model = load_hf_model(write_tiny_checkpoint(family, tmp_path / "src"))
    exported = save_hf(model, tmp_path / "out")
    hf_model = transformers.AutoModelForCausalLM.from_pretrained(str(exported)).eval()
    tokens = np.random.RandomState(0).randint(0, model.cfg.vocab_size, (2, 9))
    with torch.no_grad():
        theirs = hf_model(torch.tensor(tokens)).logits.numpy()
    np.testing.assert_allclose(np.asarray(forward_logits(model, tokens)), theirs, atol=1e-4)


def test_multi_file_export_round_trips(llama_dir, tmp_path):
    model = load_hf_model(llama_dir)
    exported = save_hf(model, tmp_path / "out", max_shard_bytes=8_000)
    assert len(list(exported.glob("model-*-of-*.safetensors"))) > 1
    assert (exported / "model.safetensors.index.json").is_file()
    again = load_hf_model(exported)
    for name in ("embed", "wq", "wo", "w_down", "final_norm"):
        np.testing.assert_array_equal(getattr(again, name)[...], getattr(model, name)[...])
    assert transformers.AutoModelForCausalLM.from_pretrained(str(exported)) is not None


def test_missing_directory_is_a_clear_error(tmp_path):
    with pytest.raises(MissingFileError, match="does not exist"):
        load_hf_model(tmp_path / "nope")


def test_missing_config_json(llama_dir, tmp_path):
    shutil.copy(llama_dir / "model.safetensors", tmp_path / "model.safetensors")
    with pytest.raises(MissingFileError, match="config.json"):
        load_hf_model(tmp_path)


def test_unsupported_architecture(llama_dir, tmp_path):
    shutil.copytree(llama_dir, tmp_path / "gpt2")
    config = json.loads((tmp_path / "gpt2" / "config.json").read_text())
    config["model_type"] = "gpt2"
    (tmp_path / "gpt2" / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match="model_type 'gpt2' is not supported"):
        load_hf_model(tmp_path / "gpt2")


def test_shapes_that_do_not_match_the_config(llama_dir, tmp_path):
    shutil.copytree(llama_dir, tmp_path / "bad")
    config = json.loads((tmp_path / "bad" / "config.json").read_text())
    config["intermediate_size"] = 96
    (tmp_path / "bad" / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match=r"mlp.gate_proj.weight: checkpoint \(64, 32\)"):
        load_hf_model(tmp_path / "bad")


def test_unsupported_setting_is_named(llama_dir, tmp_path):
    shutil.copytree(llama_dir, tmp_path / "bias")
    config = json.loads((tmp_path / "bias" / "config.json").read_text())
    config["attention_bias"] = True
    (tmp_path / "bias" / "config.json").write_text(json.dumps(config))
    with pytest.raises(SpadeError, match="attention_bias=True"):
        load_hf_model(tmp_path / "bias")
