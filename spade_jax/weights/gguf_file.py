"""A GGUF file's metadata and tensor table, parsed in one pass over the header.

The `gguf` package's reader wraps every metadata value in numpy views, which for a tokenizer's
~100k strings costs seconds each time a run starts; here strings are decoded straight from the
memory-mapped header, numeric arrays are read whole, and tensor data stays a lazy view into
the map. Little-endian GGUF versions 2 and 3 (what llama.cpp writes).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path

import gguf
import numpy as np

MAGIC = b"GGUF"
SUPPORTED_VERSIONS = (2, 3)
DEFAULT_ALIGNMENT = 32
_STRING, _ARRAY = gguf.GGUFValueType.STRING, gguf.GGUFValueType.ARRAY
_SCALARS = {  # GGUF value type -> (struct format, numpy dtype) of one little-endian value
    gguf.GGUFValueType.UINT8: ("<B", np.uint8),
    gguf.GGUFValueType.INT8: ("<b", np.int8),
    gguf.GGUFValueType.UINT16: ("<H", np.uint16),
    gguf.GGUFValueType.INT16: ("<h", np.int16),
    gguf.GGUFValueType.UINT32: ("<I", np.uint32),
    gguf.GGUFValueType.INT32: ("<i", np.int32),
    gguf.GGUFValueType.FLOAT32: ("<f", np.float32),
    gguf.GGUFValueType.BOOL: ("<?", np.bool_),
    gguf.GGUFValueType.UINT64: ("<Q", np.uint64),
    gguf.GGUFValueType.INT64: ("<q", np.int64),
    gguf.GGUFValueType.FLOAT64: ("<d", np.float64),
}
_PLAIN_TENSOR_DTYPES = {  # tensor types stored as plain arrays; the rest are quantised blocks
    gguf.GGMLQuantizationType.F16: np.float16,
    gguf.GGMLQuantizationType.F32: np.float32,
    gguf.GGMLQuantizationType.F64: np.float64,
    gguf.GGMLQuantizationType.I8: np.int8,
    gguf.GGMLQuantizationType.I16: np.int16,
    gguf.GGMLQuantizationType.I32: np.int32,
    gguf.GGMLQuantizationType.I64: np.int64,
}


class GGUFFormatError(ValueError):
    """The bytes are not a GGUF file this reader understands."""


@dataclass(frozen=True)
class GGUFTensor:
    """One tensor: its name, storage type, GGUF shape (innermost first) and raw data (numpy
    layout, outermost first; bytes per row of blocks for quantised types)."""

    name: str
    tensor_type: gguf.GGMLQuantizationType
    shape: tuple[int, ...]
    data: np.ndarray


class _Cursor:
    """Sequential little-endian reads from a buffer."""

    def __init__(self, buffer):
        self.buffer, self.offset = buffer, 0

    def unpack(self, fmt: str):
        try:
            (value,) = struct.unpack_from(fmt, self.buffer, self.offset)
        except struct.error as err:
            raise GGUFFormatError(f"truncated at byte {self.offset}") from err
        self.offset += struct.calcsize(fmt)
        return value

    def string(self) -> str:
        length = self.unpack("<Q")
        end = self.offset + length
        if end > len(self.buffer):
            raise GGUFFormatError(f"a string at byte {self.offset} runs past the end")
        value = bytes(self.buffer[self.offset:end]).decode("utf-8")
        self.offset = end
        return value

    def value(self, value_type: int):
        try:
            kind = gguf.GGUFValueType(value_type)
        except ValueError as err:
            raise GGUFFormatError(f"unknown value type {value_type} at byte {self.offset}") from err
        if kind == _STRING:
            return self.string()
        if kind == _ARRAY:
            item_type, count = self.unpack("<I"), self.unpack("<Q")
            if item_type in _SCALARS:  # numeric arrays in one read
                dtype = np.dtype(_SCALARS[item_type][1])
                end = self.offset + count * dtype.itemsize
                if end > len(self.buffer):
                    raise GGUFFormatError(f"an array at byte {self.offset} runs past the end")
                items = np.frombuffer(self.buffer, dtype.newbyteorder("<"), count, self.offset)
                self.offset = end
                return items.tolist()
            return [self.value(item_type) for _ in range(count)]
        return self.unpack(_SCALARS[kind][0])


class GGUFFile:
    """`fields`: every metadata key with its Python value (lists for arrays, as the gguf
    package's `ReaderField.contents()` gives them); `tensors`: the tensor table in file order."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self._map = np.memmap(self.path, mode="r")
        cursor = _Cursor(memoryview(self._map))
        if bytes(self._map[:4]) != MAGIC:
            raise GGUFFormatError("no GGUF magic at the start")
        cursor.offset = 4
        self.version = cursor.unpack("<I")
        if self.version not in SUPPORTED_VERSIONS:
            raise GGUFFormatError(f"version {self.version} is not one of {SUPPORTED_VERSIONS} "
                                  "(a big-endian file reads as a huge version)")
        tensor_count, field_count = cursor.unpack("<Q"), cursor.unpack("<Q")
        self.fields: dict[str, object] = {}
        for _ in range(field_count):
            key = cursor.string()
            if key in self.fields:
                raise GGUFFormatError(f"metadata key {key!r} appears twice")
            self.fields[key] = cursor.value(cursor.unpack("<I"))
        table = []
        for _ in range(tensor_count):
            name = cursor.string()
            dims = tuple(cursor.unpack("<Q") for _ in range(cursor.unpack("<I")))
            table.append((name, dims, cursor.unpack("<I"), cursor.unpack("<Q")))
        alignment = self.fields.get("general.alignment", DEFAULT_ALIGNMENT)
        if not isinstance(alignment, int) or alignment <= 0 or alignment & (alignment - 1):
            raise GGUFFormatError(f"general.alignment={alignment!r} is not a power of two")
        self.data_offset = -(-cursor.offset // alignment) * alignment
        self.tensors = [self._tensor(*entry) for entry in table]
        if len({t.name for t in self.tensors}) != len(self.tensors):
            raise GGUFFormatError("a tensor name appears twice")

    def _tensor(self, name: str, dims: tuple[int, ...], raw_type: int, offset: int) -> GGUFTensor:
        try:
            tensor_type = gguf.GGMLQuantizationType(raw_type)
        except ValueError as err:
            raise GGUFFormatError(f"tensor {name} has unknown type {raw_type}") from err
        n_elements = int(np.prod(dims, dtype=np.int64))
        numpy_shape = tuple(reversed(dims))
        if tensor_type in _PLAIN_TENSOR_DTYPES:
            dtype = np.dtype(_PLAIN_TENSOR_DTYPES[tensor_type])
            n_bytes = n_elements * dtype.itemsize
        else:
            block_size, block_bytes = gguf.GGML_QUANT_SIZES[tensor_type]
            dtype, n_bytes = np.dtype(np.uint8), n_elements * block_bytes // block_size
            numpy_shape = gguf.quants.quant_shape_to_byte_shape(numpy_shape, tensor_type)
        start = self.data_offset + offset
        if start + n_bytes > len(self._map):
            raise GGUFFormatError(f"tensor {name}'s data runs past the end of the file")
        data = self._map[start:start + n_bytes].view(dtype).reshape(numpy_shape)
        return GGUFTensor(name, tensor_type, dims, data)
