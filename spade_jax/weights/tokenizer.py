"""Tokenizers and chat formatting through `transformers`.

Three sources: an HF directory (tokenizer.json / tokenizer_config.json), a GGUF file (its
metadata holds the vocabulary, merges and chat template; transformers builds the tokenizer),
or a bare sentencepiece `tokenizer.model`. A tokenizer without a chat template gets ChatML,
so role prompts format the same way for every model we train.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path

import transformers

from spade_jax.errors import ConfigError, MissingFileError

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
ROLES = ("system", "user", "assistant")


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
        tokenizer = transformers.AutoTokenizer.from_pretrained(
            str(path.parent), gguf_file=path.name
        )
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
