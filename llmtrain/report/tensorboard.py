"""TensorBoard event files without the tensorboard/tensorflow/protobuf packages.

An event file is a sequence of TFRecords, each holding one serialized `tensorflow.Event` protobuf:

    uint64 length (little-endian) | uint32 masked CRC32C(length bytes) | data | uint32 masked CRC32C(data)

The first Event carries `file_version = "brain.Event:2"`; every later one a step and a Summary of scalar values.
Only the few protobuf fields needed for scalars are encoded (and decoded) here, by hand:

    Event          wall_time = 1 (double), step = 2 (int64), file_version = 3 (string), summary = 5 (Summary)
    Summary        value = 1 (repeated Summary.Value)
    Summary.Value  tag = 1 (string), simple_value = 2 (float)
"""

from __future__ import annotations

import math
import numbers
import os
import socket
import struct
import time

FILE_VERSION = "brain.Event:2"

# ---------------------------------------------------------------------------------------------------- CRC32C

_CRC32C_POLY = 0x82F63B78  # Castagnoli, reflected


def _crc32c_table() -> list[int]:
    table = []
    for i in range(256):
        crc = i
        for _ in range(8):
            crc = (crc >> 1) ^ _CRC32C_POLY if crc & 1 else crc >> 1
        table.append(crc)
    return table


_CRC32C_TABLE = _crc32c_table()


def crc32c(data: bytes, crc: int = 0) -> int:
    """CRC32C (Castagnoli) of `data`, continuing from `crc` (0 to start)."""
    table = _CRC32C_TABLE
    crc ^= 0xFFFFFFFF
    for byte in data:
        crc = table[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def masked_crc32c(data: bytes) -> int:
    crc = crc32c(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


# ---------------------------------------------------------------------------------------------------- protobuf

_VARINT, _FIXED64, _LEN, _FIXED32 = 0, 1, 2, 5


def _varint(value: int) -> bytes:
    value &= 0xFFFFFFFFFFFFFFFF  # negative int64: two's complement, 10 bytes
    out = bytearray()
    while True:
        bits = value & 0x7F
        value >>= 7
        if value:
            out.append(bits | 0x80)
        else:
            out.append(bits)
            return bytes(out)


def _key(field: int, wire_type: int) -> bytes:
    return _varint((field << 3) | wire_type)


def _len_field(field: int, payload: bytes) -> bytes:
    return _key(field, _LEN) + _varint(len(payload)) + payload


def _encode_value(tag: str, value: float) -> bytes:
    return _len_field(1, tag.encode("utf-8")) + _key(2, _FIXED32) + struct.pack("<f", value)


def encode_event(wall_time: float, step: int | None = None, file_version: str | None = None,
                 scalars: dict[str, float] | None = None) -> bytes:
    """Serialize an Event protobuf with the given fields (scalars: tag -> float32-representable value)."""
    out = bytearray(_key(1, _FIXED64) + struct.pack("<d", wall_time))
    if step is not None:
        out += _key(2, _VARINT) + _varint(int(step))
    if file_version is not None:
        out += _len_field(3, file_version.encode("utf-8"))
    if scalars is not None:
        summary = b"".join(_len_field(1, _encode_value(tag, v)) for tag, v in scalars.items())
        out += _len_field(5, summary)
    return bytes(out)


def _read_varint(buf: bytes, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if pos >= len(buf):
            raise ValueError("truncated varint")
        byte = buf[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, pos
        shift += 7
        if shift >= 70:
            raise ValueError("varint too long")


def _fields(buf: bytes):
    """Yield (field number, wire type, value) of a message: int for varints, bytes otherwise."""
    pos = 0
    while pos < len(buf):
        key, pos = _read_varint(buf, pos)
        field, wire = key >> 3, key & 7
        if wire == _VARINT:
            value, pos = _read_varint(buf, pos)
        elif wire == _FIXED64:
            value, pos = buf[pos:pos + 8], pos + 8
        elif wire == _LEN:
            n, pos = _read_varint(buf, pos)
            value, pos = buf[pos:pos + n], pos + n
        elif wire == _FIXED32:
            value, pos = buf[pos:pos + 4], pos + 4
        else:
            raise ValueError(f"unsupported protobuf wire type {wire}")
        if pos > len(buf):
            raise ValueError("truncated protobuf field")
        yield field, wire, value


def decode_event(data: bytes) -> dict:
    """{"wall_time", "step", "scalars": {tag: simple_value}} plus "file_version" when present."""
    event: dict = {"wall_time": 0.0, "step": 0, "scalars": {}}
    for field, wire, value in _fields(data):
        if field == 1 and wire == _FIXED64:
            event["wall_time"] = struct.unpack("<d", value)[0]
        elif field == 2 and wire == _VARINT:
            event["step"] = value - (1 << 64) if value >= 1 << 63 else value
        elif field == 3 and wire == _LEN:
            event["file_version"] = value.decode("utf-8")
        elif field == 5 and wire == _LEN:
            for f, w, entry in _fields(value):
                if f != 1 or w != _LEN:
                    continue
                tag, simple = None, None
                for vf, vw, v in _fields(entry):
                    if vf == 1 and vw == _LEN:
                        tag = v.decode("utf-8")
                    elif vf == 2 and vw == _FIXED32:
                        simple = struct.unpack("<f", v)[0]
                if tag is not None and simple is not None:
                    event["scalars"][tag] = simple
    return event


# ---------------------------------------------------------------------------------------------------- records

def encode_record(data: bytes) -> bytes:
    header = struct.pack("<Q", len(data))
    return header + struct.pack("<I", masked_crc32c(header)) + data + struct.pack("<I", masked_crc32c(data))


def read_records(path: str | os.PathLike) -> list[bytes]:
    """The payloads of a TFRecord file; ValueError on a CRC mismatch or a truncated record."""
    with open(path, "rb") as f:
        buf = f.read()
    records, pos = [], 0
    while pos < len(buf):
        if pos + 12 > len(buf):
            raise ValueError(f"{path}: truncated record header at byte {pos}")
        header = buf[pos:pos + 8]
        (length,) = struct.unpack("<Q", header)
        (length_crc,) = struct.unpack("<I", buf[pos + 8:pos + 12])
        if masked_crc32c(header) != length_crc:
            raise ValueError(f"{path}: bad length CRC at byte {pos}")
        start, end = pos + 12, pos + 12 + length
        if end + 4 > len(buf):
            raise ValueError(f"{path}: truncated record at byte {pos}")
        data = buf[start:end]
        (data_crc,) = struct.unpack("<I", buf[end:end + 4])
        if masked_crc32c(data) != data_crc:
            raise ValueError(f"{path}: bad data CRC at byte {pos}")
        records.append(data)
        pos = end + 4
    return records


def read_events(path: str | os.PathLike) -> list[dict]:
    """Decoded events of an event file (see decode_event); ValueError on a bad CRC."""
    return [decode_event(r) for r in read_records(path)]


# ---------------------------------------------------------------------------------------------------- writer

def _as_float32(value) -> float | None:
    """`value` as a finite float32-representable float, or None when it is not numeric/finite."""
    if value is None or isinstance(value, (bool, str, bytes)):
        return None
    if not isinstance(value, numbers.Real):
        try:
            value = float(value)  # 0-d tensors, numpy scalars
        except (TypeError, ValueError):
            return None
    try:
        value = float(value)
        packed = struct.pack("<f", value)
    except (TypeError, ValueError, OverflowError):
        return None
    value = struct.unpack("<f", packed)[0]
    return value if math.isfinite(value) else None


class TensorBoardWriter:
    """Appends scalar summaries to `log_dir/events.out.tfevents.{time}.{host}.{pid}.llmtrain`."""

    def __init__(self, log_dir: str | os.PathLike):
        self.log_dir = os.fspath(log_dir)
        os.makedirs(self.log_dir, exist_ok=True)
        stamp, host, pid = int(time.time()), socket.gethostname(), os.getpid()
        while True:  # two writers in one second in one process: never clobber the first file
            self.path = os.path.join(self.log_dir, f"events.out.tfevents.{stamp}.{host}.{pid}.llmtrain")
            try:
                self.file = open(self.path, "xb")
                break
            except FileExistsError:
                stamp += 1
        self.file.write(encode_record(encode_event(time.time(), file_version=FILE_VERSION)))
        self.file.flush()

    def add_scalars(self, step: int, values: dict[str, float], wall_time: float | None = None) -> None:
        """One Event at `step` with every numeric, finite value of `values` (others are skipped)."""
        if self.file is None:
            raise ValueError(f"{self.path}: writer is closed")
        scalars = {}
        for tag, value in values.items():
            v = _as_float32(value)
            if v is not None:
                scalars[str(tag)] = v
        if not scalars:
            return
        event = encode_event(time.time() if wall_time is None else float(wall_time), step=int(step),
                             scalars=scalars)
        self.file.write(encode_record(event))

    def flush(self) -> None:
        if self.file is not None:
            self.file.flush()

    def close(self) -> None:
        if self.file is not None:
            self.file.close()
            self.file = None

    def __enter__(self) -> "TensorBoardWriter":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
