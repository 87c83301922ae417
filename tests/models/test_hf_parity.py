"""Our logits equal transformers' PyTorch logits: tiny random Llama / Qwen3 / Qwen3-MoE, SmolLM2."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from spade_jax.models.transformer import forward_logits  # noqa: E402
from spade_jax.weights import (  # noqa: E402
    load_gguf,
    load_hf_model,
    load_tokenizer,
    smollm2_gguf_path,
)
from spade_jax.weights.tiny import TINY_FAMILIES, write_tiny_checkpoint  # noqa: E402


def _torch_logits(hf_model, tokens, mask=None):
    with torch.no_grad():
        kwargs = {} if mask is None else {"attention_mask": torch.tensor(mask.astype(np.int64))}
        return hf_model(torch.tensor(tokens), **kwargs).logits.float().numpy()


@pytest.mark.parametrize("family", TINY_FAMILIES)
def test_tiny_random_model_matches_transformers(family, tmp_path):
    directory = write_tiny_checkpoint(family, tmp_path / family, seed=1)
    hf_model = transformers.AutoModelForCausalLM.from_pretrained(str(directory)).eval()
    model = load_hf_model(directory)
    tokens = np.random.RandomState(0).randint(0, model.cfg.vocab_size, (3, 17))
    ours = np.asarray(forward_logits(model, tokens))
    theirs = _torch_logits(hf_model, tokens)
    assert np.abs(theirs).max() > 1.0  # weights are large enough to make the test meaningful
    np.testing.assert_allclose(ours, theirs, atol=1e-4, rtol=0)


@pytest.mark.slow
def test_smollm2_matches_transformers_gguf_loader():
    path = smollm2_gguf_path()
    # Ours: tests/weights/test_tokenizer.py holds it to transformers' on this file, whose GGUF
    # tokenizer would take as long to load as the model.
    tokenizer = load_tokenizer(path)
    hf_model = transformers.AutoModelForCausalLM.from_pretrained(
        str(path.parent), gguf_file=path.name, dtype=torch.float32
    ).eval()
    model = load_gguf(path)
    prompts = [
        "The capital of France is",
        "def fibonacci(n):\n    if n < 2:\n        return n\n",
        "<|im_start|>user\nWhy is the sky blue?<|im_end|>\n<|im_start|>assistant\n",
    ]
    for prompt in prompts:
        tokens = np.asarray([tokenizer(prompt)["input_ids"]])
        ours = np.asarray(forward_logits(model, tokens))
        theirs = _torch_logits(hf_model, tokens)
        diff = np.abs(ours - theirs).max()
        print(f"SmolLM2 max |logit diff| = {diff:.2e} over {tokens.shape[1]} tokens")
        assert diff <= 2e-3
        np.testing.assert_array_equal(ours.argmax(-1), theirs.argmax(-1))
