"""Tokenizers from an HF dir, a GGUF and a bare sentencepiece model; chat formatting.

Our GGUF tokenizer is checked token for token against transformers' GGUF tokenizer (which needs
PyTorch) on a deterministic corpus of code, unicode, whitespace, digits and special tokens.
"""

import copy
import random
import subprocess
import sys
import unicodedata

import gguf
import pytest
import sentencepiece
from tokenizers import pre_tokenizers

from spade_jax.errors import ConfigError, MissingFileError
from spade_jax.weights import format_chat, load_tokenizer, smollm2_gguf_path
from spade_jax.weights.gguf import _field, open_gguf

CONVERSATION = [
    {"role": "system", "content": "You design games."},
    {"role": "user", "content": "Make a maze."},
    {"role": "assistant", "content": "class Maze: pass"},
    {"role": "user", "content": "Now add a key."},
]
FRAGMENTS = [
    "def f(x):\n    return x ** 2  # square\n",
    "for i in range(10):\n\tprint(i, end='')\n",
    '{"id": 42, "scores": [1.5, -2e10, 0x1F], "ok": true}',
    "int main() {\n  int a[3] = {1, 22, 333};\r\n  return a[0]; }",
    "x = [\n    1,\n    2,\n]",
    "He said: \"I'll go, you're late, it's 5 o'clock\". SHE'S HERE, we'VE 'The 'Some I'DAY",
    "日本語のテキストと中文字符，한국어 문장。",
    "emoji 🙂👍🏽 family 👨\u200d👩\u200d👧\u200d👦 flags 🇫🇷🇯🇵",
    "combining: e\u0301 a\u0308 n\u0303 Z\u0336\u0321a\u0337\u0322",
    "Ελληνικά, русский, العربية, עברית, हिन्दी",
    "   leading and trailing spaces   ",
    "\t\ttabs\tand\nnewlines\r\n\r\n\n",
    "numbers 0 7 42 3.14159 1,000,000 2024-06-01 12:30 ½ ² Ⅻ ٣ 五",
    "  1  22   333\n 4\n\n 55",
    "CamelCaseIdentifier snake_case_name __dunder__ $var @decorator",
    "https://example.com/a?b=1&c=%20 mail: a.b@c.org",
    "math: ∑_{i=1}^{n} i² = n(n+1)/2 ≤ ∞ → ∀x∈ℝ",
    "", " ", "\n", "a", "!!!???...", "----====____",
]
SEPARATORS = ["", " ", "  ", "\n", "\t", "\n    ", " \n", "\r\n", "\n\n\t "]
CHARACTER_RANGES = [  # ASCII, Latin-1, Cyrillic, combining marks, CJK, Hangul, emoji
    (0x20, 0x7E), (0xA0, 0xFF), (0x400, 0x4FF), (0x300, 0x36F), (0x4E00, 0x4FFF),
    (0xAC00, 0xAD00), (0x1F300, 0x1F64F),
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


def varied_texts(special_tokens, conversation_to_text, count=1200):
    """`count` deterministic mixed strings, every special token alone and inside text, plus
    chat-templated conversations (`conversation_to_text(messages, add_generation_prompt)`)."""
    rng = random.Random(0)

    def piece():
        kind = rng.randrange(5)
        if kind == 0:
            return rng.choice(FRAGMENTS)
        if kind == 1:
            return rng.choice(special_tokens)
        if kind == 2:
            return "".join(rng.choice(" \t\n\r") for _ in range(rng.randrange(1, 9)))
        if kind == 3:
            return str(rng.randrange(10 ** rng.randrange(1, 12)))
        low, high = rng.choice(CHARACTER_RANGES)
        return "".join(chr(rng.randint(low, high)) for _ in range(rng.randrange(1, 12)))

    texts = FRAGMENTS + special_tokens + [f"text {token} more{token}\n" for token in special_tokens]
    while len(texts) < count:
        pieces = [piece() for _ in range(rng.randrange(1, 7))]
        texts.append("".join(p + rng.choice(SEPARATORS) for p in pieces))
    for i in range(100):
        roles = ["system", "user", "assistant", "user"][rng.randrange(2):rng.randrange(3, 5)]
        messages = [{"role": role, "content": piece() + " " + piece()} for role in roles]
        texts.append(conversation_to_text(messages, i % 2 == 0))
    return texts


def assert_same_tokenizer(ours, reference, texts):
    """Equal special-token attributes, encodings (with and without special tokens), decodings
    and chat templates on `texts`."""
    for name in ("bos_token", "eos_token", "pad_token", "unk_token", "bos_token_id",
                 "eos_token_id", "pad_token_id", "unk_token_id", "vocab_size",
                 "all_special_tokens", "chat_template"):
        assert getattr(ours, name) == getattr(reference, name), name
    assert len(ours) == len(reference)
    for add_special_tokens in (True, False):
        ids = ours(texts, add_special_tokens=add_special_tokens)["input_ids"]
        expected = reference(texts, add_special_tokens=add_special_tokens)["input_ids"]
        mismatches = [(t, i, e) for t, i, e in zip(texts, ids, expected, strict=True) if i != e]
        assert not mismatches, (len(mismatches), mismatches[:3])
        for skip in (False, True):
            assert (ours.batch_decode(ids, skip_special_tokens=skip)
                    == reference.batch_decode(ids, skip_special_tokens=skip))
    assert ours.batch_decode(ours(texts, add_special_tokens=False)["input_ids"]) == texts
    for messages in (CONVERSATION, CONVERSATION[1:], CONVERSATION[1:2]):
        for add in (True, False):
            for tokenize in (False, True):
                kwargs = dict(add_generation_prompt=add, tokenize=tokenize, return_dict=False)
                assert (ours.apply_chat_template(messages, **kwargs)
                        == reference.apply_chat_template(messages, **kwargs))


def chat_text(tokenizer):
    return lambda messages, add: tokenizer.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=add)


def whitespace_before_number(text: str) -> bool:
    """Whether whitespace directly precedes a number in `text`: there GPT-2's rules split the
    whitespace run (its last space may join the number), SmolLM2's keep it whole."""
    return any(a.isspace() and unicodedata.category(b).startswith("N")
               for a, b in zip(text, text[1:], strict=False))


@pytest.fixture(scope="module")
def smollm2_pair():
    """Our SmolLM2 GGUF tokenizer and transformers' (which imports PyTorch)."""
    pytest.importorskip("torch")
    import transformers

    path = smollm2_gguf_path()
    reference = transformers.AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    return load_tokenizer(path), reference


@pytest.mark.slow
def test_smollm2_gguf_matches_transformers_with_the_original_pre_tokenizer(smollm2_pair):
    """transformers' tokenizer, with SmolLM2's own pre-tokenizer (digits one by one, then GPT-2
    byte-level; its GGUF says `pre=smollm`, which transformers reads as plain GPT-2)."""
    ours, transformers_gguf = smollm2_pair
    reference = copy.deepcopy(transformers_gguf)
    reference.backend_tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
    ])
    specials = [str(token) for token in ours.added_tokens_decoder.values()]
    assert len(specials) == 17
    texts = varied_texts(specials, chat_text(reference))
    assert len(texts) >= 1000
    assert_same_tokenizer(ours, reference, texts)


@pytest.mark.slow
def test_smollm2_gguf_differs_from_transformers_only_where_digits_are_split(smollm2_pair):
    ours, reference = smollm2_pair
    # SmolLM2 was trained with digits split one by one: no token holds a number and more.
    pieces = [ours.decode([index]) for index in range(len(ours))]
    assert not [piece for piece in pieces if len(piece) > 1
                and any(unicodedata.category(c).startswith("N") for c in piece)]
    specials = [str(token) for token in ours.added_tokens_decoder.values()]
    texts = varied_texts(specials, chat_text(reference))
    unaffected = [text for text in texts if not whitespace_before_number(text)]
    assert len(unaffected) >= 600
    assert_same_tokenizer(ours, reference, unaffected)
    differing = [text for text in texts if ours.encode(text) != reference.encode(text)]
    assert len(differing) >= 100  # the corpus does exercise the difference
    code = "x = [\n    1,"  # the indentation stays whole, as in training
    assert ours.convert_ids_to_tokens(ours.encode(code))[3:5] == ["ĊĠĠĠĠ", "1"]
    assert reference.convert_ids_to_tokens(reference.encode(code))[3:6] == ["ĊĠĠĠ", "Ġ", "1"]


def write_gguf(path, architecture="llama", **tokenizer):
    """A GGUF with no tensors: `architecture`'s hyper-parameters and the given `tokenizer.*`
    metadata (GGUFWriter method suffixes: token_list=..., tokenizer_pre=...)."""
    writer = gguf.GGUFWriter(str(path), architecture)
    writer.add_block_count(1)
    writer.add_context_length(128)
    writer.add_embedding_length(64)
    writer.add_feed_forward_length(128)
    writer.add_head_count(4)
    writer.add_head_count_kv(2)
    writer.add_layer_norm_rms_eps(1e-6)
    for name, value in tokenizer.items():
        getattr(writer, f"add_{name}")(value)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.fixture(scope="module")
def byte_level_vocabulary():
    """SmolLM2's first 8000 tokens and the merges among them, plus the digit merges `1 2` and
    `12 3` (SmolLM2 has none), so rules that group digits differ from those that split them."""
    reader = open_gguf(smollm2_gguf_path())
    tokens = _field(reader, "tokenizer.ggml.tokens")[:8000]
    kept = set(tokens)
    merges = [merge for merge in _field(reader, "tokenizer.ggml.merges")
              if set(merge.split(" ")) <= kept and merge.replace(" ", "") in kept]
    return tokens + ["12", "123"], merges + ["1 2", "12 3"]


@pytest.mark.parametrize("architecture, pre, add_bos", [
    ("llama", "gpt-2", False), ("llama", "llama-bpe", True), ("qwen3", "qwen2", False),
])
def test_byte_level_gguf_tokenizers_match_transformers(
    tmp_path, byte_level_vocabulary, architecture, pre, add_bos
):
    """GPT-2, Llama-3 and Qwen split rules, BOS added or not, user-defined tokens (<think>)."""
    pytest.importorskip("torch")
    import transformers

    tokens, merges = byte_level_vocabulary
    path = write_gguf(
        tmp_path / "model.gguf", architecture, tokenizer_model="gpt2", tokenizer_pre=pre,
        token_list=tokens + ["<think>", "</think>"], token_merges=merges,
        token_types=[gguf.TokenType.CONTROL] * 17 + [gguf.TokenType.NORMAL] * (len(tokens) - 17)
        + [gguf.TokenType.USER_DEFINED] * 2,
        bos_token_id=1, eos_token_id=2, pad_token_id=0, add_bos_token=add_bos,
        chat_template=CHATML_TEMPLATE_WITH_SYSTEM,
    )
    reference = transformers.AutoTokenizer.from_pretrained(str(tmp_path), gguf_file=path.name)
    ours = load_tokenizer(path)
    assert ours("<think>1</think>")["input_ids"][1 if add_bos else 0] == len(tokens)
    texts = varied_texts(tokens[:17] + ["<think>", "</think>"], chat_text(reference))
    assert_same_tokenizer(ours, reference, texts)


CHATML_TEMPLATE_WITH_SYSTEM = (
    "{% for message in messages %}{% if loop.first and message['role'] != 'system' %}"
    "<|im_start|>system\nBe brief.<|im_end|>\n{% endif %}<|im_start|>{{ message['role'] }}\n"
    "{{ message['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def test_gguf_tokenizer_imports_no_torch():
    """The SmolLM2 tokenizer loads, encodes and formats chats where `import torch` fails."""
    script = (
        "import sys; sys.modules['torch'] = None\n"
        "from spade_jax.weights import format_chat, load_tokenizer, smollm2_gguf_path\n"
        "tokenizer = load_tokenizer(smollm2_gguf_path())\n"
        "ids = format_chat(tokenizer, [{'role': 'user', 'content': 'Make a maze.'}],"
        " tokenize=True)\n"
        "print(tokenizer.decode(ids) + '|' + str(tokenizer.eos_token_id))\n"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.endswith("Make a maze.<|im_end|>\n<|im_start|>assistant\n|2\n")


def test_gguf_without_a_usable_tokenizer(tmp_path):
    bare = write_gguf(tmp_path / "bare.gguf")
    with pytest.raises(ConfigError, match=f"{bare}.*lacks tokenizer.ggml.model"):
        load_tokenizer(bare)
    no_merges = write_gguf(tmp_path / "no_merges.gguf", tokenizer_model="gpt2",
                           tokenizer_pre="smollm", token_list=["a", "b"])
    with pytest.raises(ConfigError, match=f"{no_merges}.*lacks tokenizer.ggml.merges"):
        load_tokenizer(no_merges)
    for model, pre in (("llama", "default"), ("gpt2", "deepseek-llm")):
        path = write_gguf(tmp_path / f"{pre}.gguf", tokenizer_model=model, tokenizer_pre=pre,
                          token_list=["a", "b", "ab"], token_merges=["a b"])
        with pytest.raises(ConfigError, match=f"model='{model}'.*pre='{pre}' is not supported"):
            load_tokenizer(path)
    bad_merge = write_gguf(tmp_path / "merge.gguf", tokenizer_model="gpt2", tokenizer_pre="gpt-2",
                           token_list=["a", "b"], token_merges=["a b"])
    with pytest.raises(ConfigError, match="merge 'a b' of tokenizer.ggml.merges is not two"):
        load_tokenizer(bad_merge)
    out_of_range = write_gguf(tmp_path / "eos.gguf", tokenizer_model="gpt2", tokenizer_pre="gpt-2",
                              token_list=["a", "b", "ab"], token_merges=["a b"], eos_token_id=7)
    with pytest.raises(ConfigError, match="eos_token_id=7 is outside its 3 tokens"):
        load_tokenizer(out_of_range)
