"""model.init_from's sources other than local safetensors files: a safetensors file on an object store, read by byte
ranges (its header once, then each tensor on its own, never the whole file), and an llmtrain checkpoint folder
(DCP), local or on an object store, read one consolidated tensor at a time through its storage's reader."""

from __future__ import annotations

import io
import json
import struct

import torch

from llmtrain.checkpoint.pretrained_match import KEY
from llmtrain.checkpoint.storage import storage_for
from llmtrain.config import ConfigError

MODEL_PREFIX = "model."  # a checkpoint's model tensors are stored under model.<parameter name>
_DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
           "F8_E4M3": torch.float8_e4m3fn, "F8_E5M2": torch.float8_e5m2, "I64": torch.int64, "I32": torch.int32,
           "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8, "BOOL": torch.bool}
_HEADER_LIMIT = 100 << 20  # the format's own bound on a header


def read_range(path: str, start: int, end: int) -> bytes:
    """Bytes [start, end) of the file at `path` (on an object store, one ranged request)."""
    return storage_for(path).read_range(path, start, end)


class RemoteSafetensors:
    """One safetensors file on an object store: {name: (shape, dtype name)} from its header; tensors by name."""

    def __init__(self, path: str):
        self.path = path
        try:
            (size,) = struct.unpack("<Q", read_range(path, 0, 8))
            if size > _HEADER_LIMIT:
                raise ValueError(f"header of {size} bytes")
            header = json.loads(read_range(path, 8, 8 + size))
        except FileNotFoundError:
            raise ConfigError(path, "cannot read: no such file") from None
        except (struct.error, ValueError, UnicodeDecodeError) as e:
            raise ConfigError(path, f"not a valid safetensors file: {e}") from None
        self.data_start = 8 + size
        header.pop("__metadata__", None)
        self.entries = {name: (tuple(e["shape"]), e["dtype"], *e["data_offsets"]) for name, e in header.items()}

    def header(self) -> dict[str, tuple[tuple[int, ...], str]]:
        return {name: (shape, dtype) for name, (shape, dtype, _, _) in self.entries.items()}

    def get_tensor(self, name: str) -> torch.Tensor:
        shape, dtype, begin, end = self.entries[name]
        if dtype not in _DTYPES:
            raise ConfigError(self.path, f"{name}: dtype {dtype} is not read")
        if begin == end:
            return torch.empty(shape, dtype=_DTYPES[dtype])
        data = bytearray(read_range(self.path, self.data_start + begin, self.data_start + end))
        return torch.frombuffer(data, dtype=_DTYPES[dtype]).reshape(shape)


def remote_torch_file(path: str):
    """A torch-saved state dict on an object store, read whole (it cannot be memory-mapped from there)."""
    try:
        return torch.load(io.BytesIO(storage_for(path).read_bytes(path)), map_location="cpu", weights_only=True)
    except Exception as e:
        msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ConfigError(KEY, f"cannot read {path}: {msg[:300]}") from None


def checkpoint_model_tensors(path: str) -> dict[str, tuple[tuple[int, ...], bool]]:
    """{stored key: (shape, floating)} of the model tensors of the checkpoint folder `path`."""
    from llmtrain.checkpoint.dcp_reader import CheckpointReader
    from llmtrain.checkpoint.store import CheckpointError

    try:
        reader = CheckpointReader(path)
    except CheckpointError as e:
        raise ConfigError(KEY, f"{e.key}: {e.message}") from None
    found = {key: (tuple(md.size), md.properties.dtype.is_floating_point)
             for key, md in reader.tensors((MODEL_PREFIX,)).items()}
    if not found:
        raise ConfigError(KEY, f"{path}: no model tensors in this checkpoint (no 'model.*' keys)")
    return found


def checkpoint_reader(path) -> object:
    """What reads the checkpoint folder `path` (a str or a Path) one tensor at a time (`.read(stored key)`)."""
    from llmtrain.checkpoint.dcp_reader import CheckpointReader

    return CheckpointReader(str(path))
