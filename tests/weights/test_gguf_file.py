"""Our GGUF header reader against the gguf package's reader: every metadata value and every
tensor's name, type, shape and bytes, on the embedded SmolLM2 file and on a file holding every
GGUF value type; malformed files are named errors."""

import gguf
import numpy as np
import pytest

from spade_jax.weights.gguf import smollm2_gguf_path
from spade_jax.weights.gguf_file import GGUFFile, GGUFFormatError


def assert_same_as_the_gguf_package(path):
    ours, theirs = GGUFFile(path), gguf.GGUFReader(str(path))
    expected = {key: field.contents() for key, field in theirs.fields.items()
                if not key.startswith("GGUF.")}  # the header's own counts, not metadata
    assert ours.fields == expected
    assert [type(v) for v in ours.fields.values()] == [type(v) for v in expected.values()]
    assert ours.data_offset == theirs.data_offset
    assert len(ours.tensors) == len(theirs.tensors)
    for mine, reference in zip(ours.tensors, theirs.tensors, strict=True):
        assert (mine.name, mine.tensor_type) == (reference.name, reference.tensor_type)
        assert mine.shape == tuple(reference.shape.tolist())
        assert mine.data.dtype == reference.data.dtype
        assert mine.data.shape == reference.data.shape
        np.testing.assert_array_equal(mine.data, reference.data)


def test_smollm2_reads_as_the_gguf_package_reads_it():
    assert_same_as_the_gguf_package(smollm2_gguf_path())


def test_every_value_type_and_plain_tensors(tmp_path):
    path = tmp_path / "all.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_uint8("t.u8", 200)
    writer.add_int8("t.i8", -5)
    writer.add_uint16("t.u16", 60000)
    writer.add_int16("t.i16", -30000)
    writer.add_uint32("t.u32", 4_000_000_000)
    writer.add_int32("t.i32", -2_000_000_000)
    writer.add_float32("t.f32", 1e-5)
    writer.add_uint64("t.u64", 2**63 + 7)
    writer.add_int64("t.i64", -(2**62))
    writer.add_float64("t.f64", 0.1)
    writer.add_bool("t.bool", True)
    writer.add_string("t.str", "héllo <|im_end|>")
    writer.add_array("t.ints", [3, -1, 4])
    writer.add_array("t.floats", [0.5, 1.25])
    writer.add_array("t.strs", ["a", "", "ü c"])
    writer.add_array("t.bools", [True, False])
    writer.add_uint32("general.alignment", 64)
    writer.add_tensor("w.f32", np.arange(12, dtype=np.float32).reshape(3, 4))
    writer.add_tensor("w.f16", np.linspace(-1, 1, 10, dtype=np.float16).reshape(2, 5))
    writer.add_tensor("w.i32", np.arange(7, dtype=np.int32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    assert_same_as_the_gguf_package(path)
    read = GGUFFile(path)
    assert read.fields["t.u64"] == 2**63 + 7 and read.fields["t.strs"] == ["a", "", "ü c"]
    assert read.data_offset % 64 == 0
    np.testing.assert_array_equal(read.tensors[0].data, np.arange(12).reshape(3, 4))


@pytest.mark.parametrize("content, message", [
    (b"not a gguf file", "no GGUF magic"),
    (b"GGUF" + (9).to_bytes(4, "little"), "version 9"),
    (b"GGUF" + (3).to_bytes(4, "little") + (0).to_bytes(8, "little"), "truncated at byte 16"),
    (b"GGUF" + (3).to_bytes(4, "little") + (0).to_bytes(8, "little") + (1).to_bytes(8, "little")
     + (1000).to_bytes(8, "little") + b"key", "runs past the end"),
])
def test_malformed_headers_are_named(tmp_path, content, message):
    path = tmp_path / "bad.gguf"
    path.write_bytes(content)
    with pytest.raises(GGUFFormatError, match=message):
        GGUFFile(path)


def test_tensor_data_past_the_end_is_named(tmp_path):
    path = tmp_path / "cut.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_tensor("w", np.zeros((64, 64), np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    path.write_bytes(path.read_bytes()[:-100])
    with pytest.raises(GGUFFormatError, match="tensor w's data runs past the end"):
        GGUFFile(path)
