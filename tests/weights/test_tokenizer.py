"""Tokenizers from an HF dir, a GGUF and a bare sentencepiece model; chat formatting."""

import pytest
import sentencepiece

from spade_jax.errors import ConfigError, MissingFileError
from spade_jax.weights import format_chat, load_tokenizer, smollm2_gguf_path

CONVERSATION = [
    {"role": "system", "content": "You design games."},
    {"role": "user", "content": "Make a maze."},
    {"role": "assistant", "content": "class Maze: pass"},
    {"role": "user", "content": "Now add a key."},
]


@pytest.fixture(scope="module")
def sentencepiece_model(tmp_path_factory):
    directory = tmp_path_factory.mktemp("spm")
    text = directory / "corpus.txt"
    text.write_text("\n".join(["the quick brown fox jumps over the lazy dog"] * 50
                              + ["a maze has walls, a key and a door"] * 50))
    sentencepiece.SentencePieceTrainer.train(
        input=str(text), model_prefix=str(directory / "tokenizer"), vocab_size=60,
        model_type="bpe", bos_id=1, eos_id=2, unk_id=0, pad_id=-1,
    )
    return directory / "tokenizer.model"


def _assert_format_matches_template(tokenizer):
    for messages in (CONVERSATION[:2], CONVERSATION[1:2], CONVERSATION):
        for add in (True, False):
            expected = tokenizer.apply_chat_template(
                messages, tokenize=False, add_generation_prompt=add
            )
            assert format_chat(tokenizer, messages, add_generation_prompt=add) == expected
            ids = format_chat(tokenizer, messages, add_generation_prompt=add, tokenize=True)
            assert ids == tokenizer(expected, add_special_tokens=False)["input_ids"]


def test_sentencepiece_model_and_default_chatml(sentencepiece_model, tmp_path):
    tokenizer = load_tokenizer(sentencepiece_model)
    ids = tokenizer("the lazy fox", add_special_tokens=False)["input_ids"]
    assert tokenizer.decode(ids) == "the lazy fox"
    text = format_chat(tokenizer, CONVERSATION[1:2])
    assert text == "<|im_start|>user\nMake a maze.<|im_end|>\n<|im_start|>assistant\n"
    _assert_format_matches_template(tokenizer)
    tokenizer.save_pretrained(str(tmp_path))  # an HF directory round trip
    assert load_tokenizer(tmp_path)("the lazy fox", add_special_tokens=False)["input_ids"] == ids


@pytest.mark.slow
def test_smollm2_gguf_tokenizer_chat_template():
    tokenizer = load_tokenizer(smollm2_gguf_path())
    assert tokenizer.vocab_size == 49152
    _assert_format_matches_template(tokenizer)
    text = format_chat(tokenizer, CONVERSATION[1:2])
    assert text.startswith("<|im_start|>system\nYou are a helpful AI assistant named SmolLM")
    assert text.endswith("<|im_start|>user\nMake a maze.<|im_end|>\n<|im_start|>assistant\n")


def test_bad_inputs(sentencepiece_model, tmp_path):
    tokenizer = load_tokenizer(sentencepiece_model)
    with pytest.raises(ConfigError, match="role must be one of"):
        format_chat(tokenizer, [{"role": "robot", "content": "hi"}])
    with pytest.raises(ConfigError, match="at least one message"):
        format_chat(tokenizer, [])
    with pytest.raises(MissingFileError):
        load_tokenizer(tmp_path / "missing.model")
    with pytest.raises(MissingFileError, match="tokenizer.json"):
        load_tokenizer(tmp_path)
