"""load_policy: HF directories, GGUF, built-in names; jitted logits; clear errors."""

import numpy as np
import pytest
import sentencepiece

import spade_jax
from spade_jax.errors import ConfigError, MissingFileError
from spade_jax.models.config import Family
from spade_jax.models.transformer import forward_logits
from spade_jax.weights import load_hf_model, load_tokenizer, save_hf

pytest.importorskip("torch")
from spade_jax.weights.tiny import write_tiny_checkpoint  # noqa: E402


@pytest.fixture(scope="module")
def policy_dir(tmp_path_factory):
    """A tiny Qwen3 checkpoint exported with a (tiny sentencepiece) tokenizer."""
    root = tmp_path_factory.mktemp("policy")
    (root / "corpus.txt").write_text("play the maze game and find the key\n" * 40)
    sentencepiece.SentencePieceTrainer.train(
        input=str(root / "corpus.txt"), model_prefix=str(root / "tokenizer"), vocab_size=40,
        model_type="bpe", bos_id=1, eos_id=2, unk_id=0, pad_id=-1,
    )
    model = load_hf_model(write_tiny_checkpoint(Family.QWEN3, root / "src"))
    return save_hf(model, root / "policy", tokenizer=load_tokenizer(root / "tokenizer.model"))


def test_policy_from_hf_directory(policy_dir):
    policy = spade_jax.load_policy(policy_dir)
    assert policy.config.family == "qwen3"
    tokens = np.asarray([policy.tokenizer("find the key")["input_ids"]] * 2)
    logits = policy.logits(tokens)
    assert logits.shape == (*tokens.shape, policy.config.vocab_size)
    np.testing.assert_allclose(logits, forward_logits(policy.model, tokens), atol=1e-6)
    policy.logits(tokens)
    assert len(policy._jitted) == 1  # second call reuses the compiled function
    completions = policy.generate(["find the key"], max_new_tokens=3)
    assert len(completions) == 1


def test_policy_bad_inputs(policy_dir, tmp_path):
    with pytest.raises(MissingFileError, match="smollm2-135m-instruct"):
        spade_jax.load_policy("no-such-model")
    (tmp_path / "weights.bin").write_bytes(b"")
    with pytest.raises(ConfigError, match="not a .gguf"):
        spade_jax.load_policy(tmp_path / "weights.bin")
    policy = spade_jax.load_policy(policy_dir)
    with pytest.raises(ConfigError, match="token ids must lie in"):
        policy.logits(np.asarray([[0, 10_000]]))
    with pytest.raises(ConfigError, match=r"\[batch, time\]"):
        policy.logits(np.asarray([1, 2, 3]))


@pytest.mark.slow
def test_builtin_smollm2_policy():
    policy = spade_jax.load_policy("smollm2-135m-instruct")
    tokens = np.asarray([policy.tokenizer("The capital of France is")["input_ids"]])
    next_token = int(np.asarray(policy.logits(tokens))[0, -1].argmax())
    assert policy.tokenizer.decode(next_token).strip() == "Paris"


def test_policy_from_an_hf_hub_id_in_the_local_cache(policy_dir, tmp_path, monkeypatch):
    """An owner/name id resolves through huggingface_hub's cache layout, never the network."""
    import shutil

    from huggingface_hub import constants

    cache = tmp_path / "hub"
    commit = "0123456789abcdef0123456789abcdef01234567"
    repo = cache / "models--spade-test--tiny-qwen3"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(commit)
    shutil.copytree(policy_dir, repo / "snapshots" / commit)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")

    policy = spade_jax.load_policy("spade-test/tiny-qwen3")
    tokens = np.asarray([policy.tokenizer("find the key")["input_ids"]])
    np.testing.assert_array_equal(policy.logits(tokens),
                                  spade_jax.load_policy(policy_dir).logits(tokens))
    with pytest.raises(MissingFileError, match=r"model 'spade-test/absent' is not in the "
                                               r"local Hugging Face cache .*hf download"):
        spade_jax.load_policy("spade-test/absent")


def test_a_checkpoint_is_built_with_the_run_configs_model_options(policy_dir, tmp_path):
    """The kernels and the experts' split come from the run config, not the checkpoint: an
    MoE checkpoint loaded with moe_sharding=experts lays its experts out over 'tensor' (not
    their hidden columns, the default split), as the split's forward reads them; the run's
    loader passes every `MODEL_OPTIONS` field through."""
    import jax

    from spade_jax.config import PolicyConfig
    from spade_jax.models.attention import DecodeAttention
    from spade_jax.models.moe import MoeSharding
    from spade_jax.sharding import make_mesh
    from spade_jax.spade.runtime import load_model_and_tokenizer

    moe_dir = write_tiny_checkpoint(Family.QWEN3_MOE, tmp_path / "moe")
    mesh = make_mesh((1, 1, 2), jax.devices()[:2])
    for split, expert_axis in ((MoeSharding.FFN, 3), (MoeSharding.EXPERTS, 1)):
        model = load_hf_model(moe_dir, mesh=mesh, options={"moe_sharding": split})
        assert model.cfg.moe_sharding is split
        assert model.w_gate[...].sharding.spec[expert_axis] == "tensor", model.w_gate.sharding
    with pytest.raises(ValueError, match=r"model options \['n_layers'\]"):
        load_hf_model(moe_dir, options={"n_layers": 1})

    run_model = PolicyConfig(source=str(policy_dir), decode_attention=DecodeAttention.RAGGED,
                             moe_capacity_factor=1.5, moe_sharding=MoeSharding.EXPERTS)
    model, _ = load_model_and_tokenizer(run_model, seed=0, mesh=mesh)
    assert (model.cfg.decode_attention, model.cfg.moe_capacity_factor,
            model.cfg.moe_sharding) == (DecodeAttention.RAGGED, 1.5, MoeSharding.EXPERTS)
