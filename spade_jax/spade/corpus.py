"""Grounding corpus for Designer prompts (docs/DESIGN.md §3 and §4.1).

A corpus spec string selects the source:

* ``stdlib`` (embedded default, offline everywhere): documentation of the Python standard
  library, one document per module of `STDLIB_MODULES` (module, class and function
  docstrings) plus one per topic of ``pydoc_data.topics.topics`` (the language reference);
* ``jsonl:PATH``: SPADE's format, one JSON object per line with an ``orig_doc`` or ``text``
  field (other keys become metadata);
* ``text:GLOB``: one document per matching file (``**`` allowed), in sorted path order;
* ``tfds:NAME[:SPLIT]``: a prepared tensorflow-datasets dataset read by random access
  (``tfds.data_source``, ``array_record`` format, no TensorFlow needed, never downloads);
  split ``train`` by default, data dir from the argument or ``$TFDS_DATA_DIR``;
* ``hf:OWNER/NAME[:SPLIT]``: an HF Hub dataset repository from the local Hugging Face cache
  (``hf download OWNER/NAME --repo-type dataset`` fetches it), read by ``datasets`` from its
  data files (parquet, jsonl, ...) by random access; split ``train`` by default, the text
  field as for ``tfds``.

Documents are truncated to a whitespace-word budget (reference: 6000 words, with a
truncation note) and sampled uniformly with a caller-supplied ``numpy`` Generator, a fresh
document per generation attempt. Every document carries a stable ``doc_id``.
"""

from __future__ import annotations

import dataclasses
import glob
import importlib
import inspect
import json
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from spade_jax import hf_cache
from spade_jax.errors import SpadeError

DEFAULT_MAX_WORDS = 6000
MIN_STDLIB_DOC_WORDS = 40
TEXT_FIELDS = ("orig_doc", "text")
TFDS_TEXT_FIELDS = ("text", "orig_doc", "content", "document", "article")
STDLIB_MODULES = (
    "abc", "array", "base64", "bisect", "calendar", "cmath", "collections", "colorsys",
    "contextlib", "copy", "csv", "dataclasses", "datetime", "decimal", "difflib", "enum",
    "fnmatch", "fractions", "functools", "graphlib", "heapq", "html", "ipaddress",
    "itertools", "json", "math", "numbers", "operator", "pprint", "queue", "random", "re",
    "sched", "secrets", "shlex", "statistics", "string", "struct", "textwrap", "unicodedata",
    "urllib.parse", "zlib",
)


class CorpusError(SpadeError, ValueError):
    """A corpus spec that is malformed, points at nothing, or yields no documents."""


@dataclasses.dataclass(frozen=True)
class Document:
    """One grounding document: a stable id, its (truncated) text and source metadata."""

    doc_id: str
    text: str
    metadata: Mapping[str, Any] = dataclasses.field(default_factory=dict)


def truncate_words(text: str, max_words: int = DEFAULT_MAX_WORDS) -> str:
    """Keep the first ``max_words`` whitespace words, with the reference's truncation note.

    Text within the budget is returned unchanged (its layout kept).
    """
    words = text.split()
    if len(words) <= max_words:
        return text
    return " ".join(words[:max_words]) + f"\n[Document truncated at ~{max_words} words]"


class Corpus:
    """A random-access collection of documents with seeded uniform sampling.

    ``fetch(index)`` returns the untruncated document; truncation happens on access so that
    large sources (tfds) are never read in full.
    """

    def __init__(
        self,
        spec: str,
        size: int,
        fetch: Callable[[int], Document],
        max_words: int = DEFAULT_MAX_WORDS,
    ) -> None:
        if size <= 0:
            raise CorpusError(f"corpus {spec!r} has no documents")
        if max_words <= 0:
            raise CorpusError(f"max_words must be positive, got {max_words}")
        self.spec = spec
        self._size = size
        self._fetch = fetch
        self.max_words = max_words

    def __len__(self) -> int:
        return self._size

    def __repr__(self) -> str:
        return f"Corpus({self.spec!r}, documents={self._size}, max_words={self.max_words})"

    def document(self, index: int) -> Document:
        """Document ``index`` (0 <= index < len), truncated to ``max_words``."""
        if not 0 <= index < self._size:
            raise IndexError(f"document index {index} out of range for {self!r}")
        document = self._fetch(int(index))
        return dataclasses.replace(document, text=truncate_words(document.text, self.max_words))

    def sample(self, rng: np.random.Generator) -> Document:
        """One document drawn uniformly with ``rng`` (deterministic given its state)."""
        return self.document(int(rng.integers(self._size)))


def _public_members(module: Any) -> list[tuple[str, Any]]:
    names = getattr(module, "__all__", None)
    if names is None:
        own = {module.__name__, "_" + module.__name__.rsplit(".", 1)[-1]}
        names = [
            name
            for name in dir(module)
            if not name.startswith("_")
            and getattr(getattr(module, name), "__module__", None) in own
        ]
    members = []
    for name in sorted(set(names)):
        member = getattr(module, name, None)
        if (inspect.isclass(member) or callable(member)) and inspect.getdoc(member):
            members.append((name, member))
    return members


def _signature(member: Any) -> str:
    try:
        return str(inspect.signature(member))
    except (TypeError, ValueError):
        return ""


def _module_document(module_name: str) -> Document | None:
    try:
        module = importlib.import_module(module_name)
    except ImportError:
        return None
    sections = [f"Python standard library: module {module_name}", inspect.getdoc(module) or ""]
    for name, member in _public_members(module):
        kind = "class" if inspect.isclass(member) else "function"
        sections.append(
            f"{kind} {module_name}.{name}{_signature(member)}\n{inspect.getdoc(member)}"
        )
        if inspect.isclass(member):
            for method_name, method in sorted(vars(member).items()):
                if method_name.startswith("_") or not callable(method):
                    continue
                doc = inspect.getdoc(method)
                if doc:
                    sections.append(f"method {module_name}.{name}.{method_name}\n{doc}")
    text = "\n\n".join(section for section in sections if section.strip())
    if len(text.split()) < MIN_STDLIB_DOC_WORDS:
        return None
    return Document(f"stdlib:module:{module_name}", text, {"source": "stdlib"})


def stdlib_documents() -> list[Document]:
    """The embedded corpus: `STDLIB_MODULES` documents, then language-reference topics.

    Deterministic order for a given Python installation (modules in the listed order, topics
    sorted by name); modules missing from a stripped-down installation are left out.
    """
    documents = [doc for name in STDLIB_MODULES if (doc := _module_document(name)) is not None]
    from pydoc_data.topics import topics

    for topic in sorted(topics):
        text = f"Python language reference: {topic}\n\n{topics[topic].strip()}"
        if len(text.split()) >= MIN_STDLIB_DOC_WORDS:
            documents.append(Document(f"stdlib:topic:{topic}", text, {"source": "pydoc_topics"}))
    return documents


def _jsonl_documents(path: Path) -> list[Document]:
    if not path.is_file():
        raise CorpusError(f"corpus file not found: {path}")
    documents = []
    with path.open(encoding="utf-8") as handle:
        for line_number, line in enumerate(handle, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as error:
                raise CorpusError(f"{path}:{line_number}: not valid JSON ({error})") from error
            if not isinstance(record, dict):
                raise CorpusError(f"{path}:{line_number}: expected a JSON object")
            text = next((record[k] for k in TEXT_FIELDS if record.get(k)), "")
            text = text if isinstance(text, str) else str(text)
            if not text.strip():
                continue
            metadata = {k: v for k, v in record.items() if k not in TEXT_FIELDS}
            documents.append(Document(f"jsonl:{path.name}:{line_number}", text.strip(), metadata))
    return documents


def _text_documents(pattern: str) -> list[Document]:
    paths = sorted(p for p in glob.glob(pattern, recursive=True) if os.path.isfile(p))
    if not paths:
        raise CorpusError(f"no files match the corpus glob {pattern!r}")
    documents = []
    for path in paths:
        text = Path(path).read_text(encoding="utf-8", errors="replace").strip()
        if text:
            documents.append(Document(f"text:{path}", text, {"path": path}))
    return documents


def _tfds_corpus(
    name: str, split: str, data_dir: str | None, text_field: str | None, max_words: int
) -> Corpus:
    try:
        import tensorflow_datasets as tfds
    except ImportError as error:
        raise CorpusError(
            "corpus 'tfds:...' needs tensorflow-datasets (pip install tensorflow-datasets "
            "array_record); TensorFlow itself is not needed"
        ) from error
    data_dir = data_dir or os.environ.get("TFDS_DATA_DIR")
    spec = f"tfds:{name}:{split}"
    try:
        source = tfds.data_source(name, split=split, data_dir=data_dir, download=False)
    except Exception as error:
        raise CorpusError(
            f"cannot open {spec} in data_dir={data_dir!r}: {type(error).__name__}: {error}. "
            "The dataset must be prepared there in the array_record format."
        ) from error
    fields = (text_field,) if text_field else TFDS_TEXT_FIELDS

    def fetch(index: int) -> Document:
        record = source[index]
        field = next((f for f in fields if f in record), None)
        if field is None:
            raise CorpusError(
                f"{spec} record {index} has none of the text fields {fields}; "
                f"its fields are {sorted(record)}"
            )
        text = record[field]
        text = text.decode("utf-8", errors="replace") if isinstance(text, bytes) else str(text)
        return Document(f"{spec}:{index}", text, {"source": spec})

    return Corpus(spec, len(source), fetch, max_words)


def _hf_corpus(repo_id: str, split: str, text_field: str | None, max_words: int) -> Corpus:
    try:
        import datasets
    except ImportError as error:
        raise CorpusError("corpus 'hf:...' needs datasets: pip install -e .[hf]") from error
    spec = f"hf:{repo_id}:{split}"
    directory = hf_cache.snapshot(repo_id, repo_type="dataset")
    try:
        source = datasets.load_dataset(str(directory), split=split)
    except Exception as error:
        raise CorpusError(f"cannot read {spec} from {directory}: {type(error).__name__}: "
                          f"{error}") from error
    fields = (text_field,) if text_field else TFDS_TEXT_FIELDS
    field = next((f for f in fields if f in source.column_names), None)
    if field is None:
        raise CorpusError(f"{spec} has none of the text fields {fields}; its columns are "
                          f"{source.column_names}")

    def fetch(index: int) -> Document:
        return Document(f"{spec}:{index}", str(source[index][field]), {"source": spec})

    return Corpus(spec, len(source), fetch, max_words)


def load_corpus(
    spec: str,
    *,
    max_words: int = DEFAULT_MAX_WORDS,
    tfds_data_dir: str | None = None,
    tfds_text_field: str | None = None,
) -> Corpus:
    """Build the `Corpus` named by ``spec`` (see the module docstring for the forms)."""
    kind, _, argument = spec.partition(":")
    if kind == "stdlib" and not argument:
        documents = stdlib_documents()
    elif kind == "jsonl" and argument:
        documents = _jsonl_documents(Path(argument).expanduser())
    elif kind == "text" and argument:
        documents = _text_documents(os.path.expanduser(argument))
    elif kind == "tfds" and argument:
        name, _, split = argument.partition(":")
        if not name:
            raise CorpusError(f"corpus spec {spec!r} names no dataset")
        return _tfds_corpus(name, split or "train", tfds_data_dir, tfds_text_field, max_words)
    elif kind == "hf" and argument:
        repo_id, _, split = argument.partition(":")
        if not hf_cache.HUB_ID.match(repo_id):
            raise CorpusError(f"corpus spec {spec!r}: {repo_id!r} is not an HF Hub id "
                              "(OWNER/NAME)")
        return _hf_corpus(repo_id, split or "train", tfds_text_field, max_words)
    else:
        raise CorpusError(
            f"bad corpus spec {spec!r}; use 'stdlib', 'jsonl:PATH', 'text:GLOB', "
            "'tfds:NAME[:SPLIT]' or 'hf:OWNER/NAME[:SPLIT]'"
        )
    return Corpus(spec, len(documents), documents.__getitem__, max_words)
