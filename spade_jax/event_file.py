"""TensorBoard scalar event files, written without TensorFlow, tensorboardX or PyTorch.

An event file is a sequence of TFRecords (length, masked CRC32C of the length, the serialized
`tensorflow.Event` proto, masked CRC32C of the data). We only write scalars, so the two protos
involved (`Event`, `Summary.Value`) are encoded by hand. The file goes through
`workdir.open_append`, so a `gs://` workdir gets its events like every other file.
"""

from __future__ import annotations

import os
import socket
import struct
import time

from etils import epath

from spade_jax.workdir import open_append

FILE_VERSION = b"brain.Event:2"


def _crc32c_table() -> tuple[int, ...]:
    table = []
    for byte in range(256):
        crc = byte
        for _ in range(8):
            crc = (crc >> 1) ^ 0x82F63B78 if crc & 1 else crc >> 1
        table.append(crc)
    return tuple(table)


_CRC32C_TABLE = _crc32c_table()


def crc32c(data: bytes) -> int:
    """CRC-32C (Castagnoli), the checksum TFRecord framing uses."""
    crc = 0xFFFFFFFF
    for byte in data:
        crc = _CRC32C_TABLE[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def masked_crc32c(data: bytes) -> int:
    """TFRecord's masked CRC: rotated right by 15 bits plus a constant, modulo 2**32."""
    crc = crc32c(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def tf_record(data: bytes) -> bytes:
    """One TFRecord: little-endian length, its masked CRC, the data, the data's masked CRC."""
    length = struct.pack("<Q", len(data))
    return (length + struct.pack("<I", masked_crc32c(length)) + data
            + struct.pack("<I", masked_crc32c(data)))


def _varint(value: int) -> bytes:
    value &= (1 << 64) - 1  # protobuf's int64: negatives as their two's complement
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _length_delimited(field: int, payload: bytes) -> bytes:
    return _varint(field << 3 | 2) + _varint(len(payload)) + payload


def scalar_summary_value(tag: str, value: float) -> bytes:
    """`Summary.Value{tag, simple_value}` serialized."""
    return _length_delimited(1, tag.encode("utf-8")) + b"\x15" + struct.pack("<f", value)


def event(wall_time: float, step: int, *, file_version: bytes | None = None,
          scalars: dict[str, float] | None = None) -> bytes:
    """`Event{wall_time, step, file_version | summary{value...}}` serialized."""
    out = b"\x09" + struct.pack("<d", wall_time) + b"\x10" + _varint(step)
    if file_version is not None:
        out += _length_delimited(3, file_version)
    if scalars:
        summary = b"".join(_length_delimited(1, scalar_summary_value(tag, value))
                           for tag, value in scalars.items())
        out += _length_delimited(5, summary)
    return out


class ScalarEventWriter:
    """Appends one event per step, holding that step's scalars, to a new event file in
    `directory` (created). A resumed run starts a new file; TensorBoard reads them all."""

    def __init__(self, directory: str | os.PathLike):
        directory = epath.Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        now = time.time_ns()  # in the name, so that files sort by start and never collide
        self.path = directory / f"events.out.tfevents.{now}.{socket.gethostname()}.{os.getpid()}"
        self._file = open_append(self.path, binary=True)
        self._file.write(tf_record(event(now / 1e9, 0, file_version=FILE_VERSION)))
        self._file.flush()

    def write(self, step: int, scalars: dict[str, float]) -> None:
        self._file.write(tf_record(event(time.time(), step, scalars=scalars)))

    def flush(self) -> None:
        self._file.flush()

    def close(self) -> None:
        self._file.close()
