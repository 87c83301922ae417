"""Tokenizers and chat formatting through `transformers`.

Three sources: an HF directory (tokenizer.json / tokenizer_config.json), a GGUF file, or a bare
sentencepiece `tokenizer.model`. A GGUF tokenizer is built here from the file's own metadata
(vocabulary, merges, token types, special ids, `tokenizer.ggml.pre` split rules, chat template)
with the `tokenizers` package, because transformers' GGUF reader imports PyTorch. A tokenizer
without a chat template gets ChatML, so role prompts format the same way for every model we train.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path

import gguf
import tokenizers
import transformers
from tokenizers import decoders, models, pre_tokenizers

from spade_jax.errors import ConfigError, MissingFileError
from spade_jax.weights.gguf import _field, open_gguf

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
ROLES = ("system", "user", "assistant")

_GPT2_SPLIT = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
# What `tokenizer.ggml.pre` names, as llama.cpp reads it: the regexes that cut text into words
# before merging, each applied to the pieces the previous one left, written as in the original
# tokenizer.json. SmolLM2's `smollm` splits digits one by one first; transformers' GGUF reader
# takes it for plain GPT-2, so it differs from SmolLM2's own tokenizer where whitespace precedes
# a number ("\n    1": "ĊĠĠĠ", "Ġ", "1" there, "ĊĠĠĠĠ", "1" here and in training).
GGUF_PRE_SPLITS = {
    "gpt-2": (_GPT2_SPLIT,),
    "smollm": (r"\p{N}", _GPT2_SPLIT),
    "llama-bpe": (  # Llama 3
        r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
        r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
    ),
    "qwen2": (  # Qwen2, Qwen2.5, Qwen3
        r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
        r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
    ),
}
_KEYS = gguf.Keys.Tokenizer


def load_tokenizer(path: str | Path):
    """An HF tokenizer from an HF directory, a `.gguf` file or a sentencepiece `.model` file."""
    path = Path(path)
    if not path.exists():
        raise MissingFileError(f"tokenizer source {path} does not exist")
    if path.is_dir():
        if not any((path / name).is_file() for name in ("tokenizer.json", "tokenizer_config.json")):
            raise MissingFileError(
                f"{path} has no tokenizer.json or tokenizer_config.json; copy the tokenizer "
                "files of the checkpoint into it, or pass a tokenizer.model / .gguf file"
            )
        tokenizer = transformers.AutoTokenizer.from_pretrained(str(path))
    elif path.suffix == ".gguf":
        tokenizer = gguf_tokenizer(path)
    elif path.suffix == ".model":
        # transformers converts a sentencepiece model it finds as `tokenizer.model` in a dir.
        with tempfile.TemporaryDirectory() as scratch:
            shutil.copy(path, Path(scratch) / "tokenizer.model")
            tokenizer = transformers.LlamaTokenizer.from_pretrained(scratch)
    else:
        raise ConfigError(
            f"cannot build a tokenizer from {path}: pass an HF directory, a .gguf file or a "
            "sentencepiece tokenizer.model"
        )
    if not tokenizer.chat_template:
        tokenizer.chat_template = CHATML_TEMPLATE
    return tokenizer


def gguf_tokenizer(path: Path) -> transformers.PreTrainedTokenizerFast:
    """The byte-level BPE tokenizer a GGUF file's `tokenizer.*` metadata describes.

    Control tokens (e.g. `<|im_end|>`) become special tokens and user-defined ones (e.g.
    `<think>`) added tokens, so both stay whole in text, as in llama.cpp.
    """
    reader = open_gguf(path)

    def required(key: str):
        value = _field(reader, key)
        if value is None:
            raise ConfigError(
                f"{path} has no tokenizer: its metadata lacks {key}; pass the checkpoint's HF "
                "tokenizer directory (or a GGUF written by llama.cpp's converter) instead"
            )
        return value

    model, pre = required(_KEYS.MODEL), required(_KEYS.PRE)
    if model != "gpt2" or pre not in GGUF_PRE_SPLITS:
        raise ConfigError(
            f"{path}: tokenizer {_KEYS.MODEL}={model!r} {_KEYS.PRE}={pre!r} is not supported; "
            f"spade_jax reads byte-level BPE ('gpt2') GGUF tokenizers with {_KEYS.PRE} one of "
            f"{sorted(GGUF_PRE_SPLITS)}; pass the checkpoint's HF tokenizer directory instead"
        )
    tokens, merges = required(_KEYS.LIST), required(_KEYS.MERGES)
    types = _field(reader, _KEYS.TOKEN_TYPE, [gguf.TokenType.NORMAL] * len(tokens))
    vocab = {token: index for index, token in enumerate(tokens)}
    pairs = [tuple(merge.split(" ", 1)) for merge in merges]
    for pair in pairs:  # the tokenizers package would panic on these, not raise
        if len(pair) != 2 or not all(token in vocab for token in (*pair, "".join(pair))):
            raise ConfigError(f"{path}: merge {' '.join(pair)!r} of {_KEYS.MERGES} is not two "
                              f"tokens of {_KEYS.LIST} that join into a third")
    backend = tokenizers.Tokenizer(models.BPE(vocab=vocab, merges=pairs))
    splits = [tokenizers.Regex(split) for split in GGUF_PRE_SPLITS[pre]]
    backend.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Split(split, "isolated") for split in splits]
        + [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]
    )
    backend.decoder = decoders.ByteLevel()
    for kind, special in ((gguf.TokenType.CONTROL, True), (gguf.TokenType.USER_DEFINED, False)):
        backend.add_tokens([
            tokenizers.AddedToken(token, special=special, normalized=False)
            for token, token_type in zip(tokens, types, strict=True) if token_type == kind
        ])

    def token_at(key: str) -> str | None:
        index = _field(reader, key)
        if index is not None and not 0 <= index < len(tokens):
            raise ConfigError(f"{path}: {key}={index} is outside its {len(tokens)} tokens")
        return None if index is None else tokens[index]

    return transformers.PreTrainedTokenizerFast(
        tokenizer_object=backend,
        bos_token=token_at(_KEYS.BOS_ID),
        eos_token=token_at(_KEYS.EOS_ID),
        unk_token=token_at(_KEYS.UNK_ID),
        pad_token=token_at(_KEYS.PAD_ID),
        add_bos_token=bool(_field(reader, _KEYS.ADD_BOS, False)),
        add_eos_token=bool(_field(reader, _KEYS.ADD_EOS, False)),
        chat_template=_field(reader, _KEYS.CHAT_TEMPLATE),
    )


def _check_messages(messages: Sequence[dict]) -> None:
    if not messages:
        raise ConfigError("format_chat needs at least one message")
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or set(message) != {"role", "content"}:
            raise ConfigError(
                f"message {i} must be a dict with exactly 'role' and 'content', got {message!r}"
            )
        if message["role"] not in ROLES or not isinstance(message["content"], str):
            raise ConfigError(
                f"message {i}: role must be one of {ROLES} and content a str, got {message!r}"
            )


def format_chat(
    tokenizer, messages: Sequence[dict], *, add_generation_prompt: bool = True, tokenize=False
) -> str | list[int]:
    """The model's chat-template rendering of `messages` (text, or token ids if `tokenize`).

    Role prompts (Designer, Agent, environment observations) all go through here, so they match
    what the checkpoint was trained on; messages are checked first for a clear error.
    """
    _check_messages(messages)
    text = tokenizer.apply_chat_template(
        list(messages), tokenize=False, add_generation_prompt=add_generation_prompt
    )
    if not tokenize:
        return text
    return tokenizer(text, add_special_tokens=False)["input_ids"]
