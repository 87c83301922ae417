"""Our TensorBoard event files, read back by TensorBoard itself: the hand-encoded protos parse
as `tensorflow.Event`, the TFRecord checksums verify, and the metrics a run writes (across a
resume) come back as scalars per cycle."""

import math
import struct

import pytest

from spade_jax import event_file
from spade_jax.metrics import MetricsWriter

event_pb2 = pytest.importorskip("tensorboard.compat.proto.event_pb2")


def test_crc32c_check_values():
    """The CRC-32C check value and the RFC 3720 (iSCSI) test vectors."""
    assert event_file.crc32c(b"123456789") == 0xE3069283
    assert event_file.crc32c(bytes(32)) == 0x8A9136AA
    assert event_file.crc32c(b"\xff" * 32) == 0x62A8AB43
    assert event_file.crc32c(bytes(range(32))) == 0x46DD794E


@pytest.mark.parametrize("step", [0, 1, 300, 2**40, -5])
def test_event_parses_as_tensorflow_event(step):
    data = event_file.event(1234.5, step, scalars={"a/b": 0.25, "regret/mean": -3.0})
    parsed = event_pb2.Event.FromString(data)
    assert parsed.wall_time == 1234.5 and parsed.step == step
    assert [(v.tag, v.simple_value) for v in parsed.summary.value] == [("a/b", 0.25),
                                                                       ("regret/mean", -3.0)]
    header = event_pb2.Event.FromString(
        event_file.event(1.0, 0, file_version=event_file.FILE_VERSION))
    assert header.file_version == "brain.Event:2" and not header.HasField("summary")


def test_tf_record_framing_and_checksums():
    data = b"payload"
    record = event_file.tf_record(data)
    (length,) = struct.unpack("<Q", record[:8])
    assert length == len(data) and record[12:12 + length] == data
    assert struct.unpack("<I", record[8:12])[0] == event_file.masked_crc32c(record[:8])
    assert struct.unpack("<I", record[-4:])[0] == event_file.masked_crc32c(data)
    assert len(record) == 8 + 4 + len(data) + 4


def _scalars(directory):
    from tensorboard.backend.event_processing import event_accumulator

    accumulator = event_accumulator.EventAccumulator(str(directory))
    accumulator.Reload()
    return {tag: [(e.step, e.value) for e in accumulator.Scalars(tag)]
            for tag in accumulator.Tags()["scalars"]}


def test_tensorboard_reads_a_runs_metrics_across_a_resume(tmp_path):
    writer = MetricsWriter(str(tmp_path))
    writer.write(0, {"regret/mean": 0.5, "train/loss": math.nan})
    writer.write(1, {"regret/mean": -0.25, "train/loss": 2.0})
    writer.close()
    resumed = MetricsWriter(str(tmp_path))  # a resumed run: a second file, same directory
    resumed.write(2, {"regret/mean": 1.0, "train/loss": 1.5})
    resumed.close()
    assert len(list((tmp_path / "tensorboard").iterdir())) == 2
    assert _scalars(tmp_path / "tensorboard") == {
        "regret/mean": [(0, 0.5), (1, -0.25), (2, 1.0)],
        "train/loss": [(1, 2.0), (2, 1.5)],  # NaN is not written
    }


def test_a_corrupted_record_is_refused_by_tensorboard(tmp_path):
    from tensorboard.backend.event_processing import event_file_loader

    writer = event_file.ScalarEventWriter(tmp_path)
    writer.write(7, {"x": 1.0})
    writer.close()
    good = list(event_file_loader.RawEventFileLoader(str(writer.path)).Load())
    assert len(good) == 2
    data = bytearray(writer.path.read_bytes())
    data[-6] ^= 0xFF  # inside the last record's payload
    writer.path.write_bytes(bytes(data))
    assert len(list(event_file_loader.RawEventFileLoader(str(writer.path)).Load())) == 1
