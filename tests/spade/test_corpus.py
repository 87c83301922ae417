"""Grounding corpus sources, seeded sampling, truncation and errors (incl. an offline tfds set)."""

import json

import numpy as np
import pytest

from spade_jax.spade import corpus as C


def test_truncate_words_golden():
    assert C.truncate_words("a b c d", 2) == "a b\n[Document truncated at ~2 words]"
    assert C.truncate_words("a\nb  c", 3) == "a\nb  c"  # within budget: unchanged


def test_stdlib_corpus_is_deterministic_and_bounded():
    corpus = C.load_corpus("stdlib", max_words=300)
    again = C.load_corpus("stdlib", max_words=300)
    ids = [corpus.document(i).doc_id for i in range(len(corpus))]
    assert ids == [again.document(i).doc_id for i in range(len(again))]
    assert len(corpus) > 50 and len(set(ids)) == len(ids)
    assert "stdlib:module:json" in ids and "stdlib:topic:for" in ids
    json_doc = corpus.document(ids.index("stdlib:module:json"))
    assert json_doc.text.startswith("Python standard library: module json")
    assert "json.dumps" in C.load_corpus("stdlib").document(ids.index("stdlib:module:json")).text
    assert all(len(corpus.document(i).text.split()) <= 300 + 6 for i in range(len(corpus)))


def test_seeded_sampling():
    corpus = C.load_corpus("stdlib")
    first = [corpus.sample(np.random.default_rng(3)).doc_id for _ in range(2)]
    rng_a, rng_b = np.random.default_rng(11), np.random.default_rng(11)
    seq_a = [corpus.sample(rng_a).doc_id for _ in range(5)]
    seq_b = [corpus.sample(rng_b).doc_id for _ in range(5)]
    assert first[0] == first[1] and seq_a == seq_b
    assert len(set(seq_a)) > 1


def test_jsonl_source(tmp_path):
    path = tmp_path / "docs.jsonl"
    lines = [
        {"orig_doc": "first document " * 4, "source": "spice"},
        {"text": "second document"},
        {"text": "   "},  # empty: skipped
        {"orig_doc": "", "text": "third falls back to text"},
    ]
    path.write_text("\n".join(json.dumps(line) for line in lines) + "\n\n")
    corpus = C.load_corpus(f"jsonl:{path}", max_words=3)
    assert len(corpus) == 3
    first = corpus.document(0)
    assert first.doc_id == "jsonl:docs.jsonl:1"
    assert first.text == "first document first\n[Document truncated at ~3 words]"
    assert first.metadata == {"source": "spice"}
    assert corpus.document(2).doc_id == "jsonl:docs.jsonl:4"
    assert corpus.document(2).text.startswith("third falls back")


def test_jsonl_errors(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "ok"}\n{not json\n')
    with pytest.raises(C.CorpusError, match="bad.jsonl:2"):
        C.load_corpus(f"jsonl:{bad}")
    empty = tmp_path / "empty.jsonl"
    empty.write_text('{"text": ""}\n')
    with pytest.raises(C.CorpusError, match="no documents"):
        C.load_corpus(f"jsonl:{empty}")
    with pytest.raises(C.CorpusError, match="not found"):
        C.load_corpus(f"jsonl:{tmp_path / 'absent.jsonl'}")


def test_text_glob_source(tmp_path):
    (tmp_path / "sub").mkdir()
    (tmp_path / "b.txt").write_text("bravo text")
    (tmp_path / "sub" / "a.txt").write_text("alpha text")
    (tmp_path / "empty.txt").write_text("")
    corpus = C.load_corpus(f"text:{tmp_path}/**/*.txt")
    texts = [corpus.document(i).text for i in range(len(corpus))]
    assert texts == ["bravo text", "alpha text"]  # sorted paths; empty file skipped
    assert corpus.document(0).doc_id == f"text:{tmp_path}/b.txt"
    with pytest.raises(C.CorpusError, match="no files match"):
        C.load_corpus(f"text:{tmp_path}/*.md")


@pytest.mark.parametrize("spec", ["", "stdlib:x", "jsonl:", "text:", "tfds:", "tfds::train",
                                  "wiki", "hf:wikipedia"])
def test_bad_specs(spec):
    with pytest.raises(C.CorpusError, match="corpus spec|names no dataset"):
        C.load_corpus(spec)


def test_index_out_of_range():
    corpus = C.Corpus("x", 1, lambda i: C.Document("x:0", "text"))
    with pytest.raises(IndexError):
        corpus.document(1)


def _build_tiny_tfds(data_dir):
    tfds = pytest.importorskip("tensorflow_datasets")

    class SpadeTinyDocs(tfds.core.GeneratorBasedBuilder, skip_registration=True):
        """A four-document corpus written offline in array_record format."""

        VERSION = tfds.core.Version("1.0.0")

        def _info(self):
            return tfds.core.DatasetInfo(
                builder=self,
                features=tfds.features.FeaturesDict(
                    {"text": tfds.features.Text(), "idx": np.int32}
                ),
            )

        def _split_generators(self, dl_manager):
            return {
                "train": self._generate_examples(range(3)),
                "test": self._generate_examples(range(3, 4)),
            }

        def _generate_examples(self, indices):
            for i in indices:
                yield i, {"text": f"tiny document {i} " + "word " * 10, "idx": i}

    SpadeTinyDocs(data_dir=str(data_dir), file_format="array_record").download_and_prepare()
    return "spade_tiny_docs"


def test_tfds_source(tmp_path, monkeypatch):
    name = _build_tiny_tfds(tmp_path)
    corpus = C.load_corpus(f"tfds:{name}", tfds_data_dir=str(tmp_path), max_words=4)
    assert len(corpus) == 3
    doc = corpus.document(0)
    assert doc.doc_id == f"tfds:{name}:train:0"
    assert doc.text.startswith("tiny document ") and doc.text.endswith("~4 words]")
    texts = {corpus.document(i).text.split()[2] for i in range(3)}
    assert texts == {"0", "1", "2"}
    monkeypatch.setenv("TFDS_DATA_DIR", str(tmp_path))
    test_split = C.load_corpus(f"tfds:{name}:test")
    assert len(test_split) == 1 and test_split.document(0).text.startswith("tiny document 3")
    assert test_split.sample(np.random.default_rng(0)).doc_id == f"tfds:{name}:test:0"
    with pytest.raises(C.CorpusError, match="none of the text fields"):
        C.load_corpus(f"tfds:{name}", tfds_text_field="body").document(0)
    with pytest.raises(C.CorpusError, match="cannot open tfds:no_such_set:train"):
        C.load_corpus("tfds:no_such_set")


def _hf_dataset_cache(cache, repo_id, splits):
    """An HF Hub dataset repository laid out in `cache` as huggingface_hub stores it."""
    datasets = pytest.importorskip("datasets")
    commit = "0123456789abcdef0123456789abcdef01234567"
    repo = cache / f"datasets--{repo_id.replace('/', '--')}"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(commit)
    (repo / "snapshots" / commit / "data").mkdir(parents=True)
    for split, rows in splits.items():
        path = repo / "snapshots" / commit / "data" / f"{split}-00000-of-00001.parquet"
        datasets.Dataset.from_dict(rows).to_parquet(str(path))


def test_hf_source_reads_a_dataset_from_the_local_hub_cache(tmp_path, monkeypatch):
    pytest.importorskip("datasets")
    import datasets
    from huggingface_hub import constants

    from spade_jax.errors import MissingFileError

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "datasets")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    _hf_dataset_cache(tmp_path / "hub", "spade-test/docs", {
        "train": {"content": [f"train document {i} " + "word " * 10 for i in range(3)],
                  "url": ["a", "b", "c"]},
        "test": {"content": ["the held-out document"], "url": ["d"]}})

    corpus = C.load_corpus("hf:spade-test/docs", max_words=3)
    assert len(corpus) == 3
    document = corpus.document(2)
    assert document.doc_id == "hf:spade-test/docs:train:2"
    assert document.text.startswith("train document 2")
    assert "truncated" in document.text  # 3 of 12 words kept
    assert C.load_corpus("hf:spade-test/docs:test").document(0).text == "the held-out document"
    with pytest.raises(C.CorpusError, match=r"none of the text fields \('body',\)"):
        C.load_corpus("hf:spade-test/docs", tfds_text_field="body")
    with pytest.raises(MissingFileError, match=r"dataset 'spade-test/absent' is not in the local "
                                               r"Hugging Face cache .*--repo-type dataset"):
        C.load_corpus("hf:spade-test/absent")
