"""safetensors files: written atomically, read whole, or only their headers (names, shapes, dtypes).

Everything goes through the `safetensors` package; a missing, unreadable or malformed file is a ConfigError
naming it.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file

from llmtrain.config import ConfigError


def process_umask() -> int:
    """The process umask, read without changing it (os.umask would race with other threads)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    return 0o022


def _dense_unshared(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """`tensors` as safetensors takes them: contiguous CPU tensors, none sharing its storage with another."""
    out, storages = {}, set()
    for name, t in tensors.items():
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name}: not a tensor ({type(t).__name__})")
        t = t.detach().to("cpu").contiguous()
        if t.numel() and t.untyped_storage().data_ptr() in storages:
            t = t.clone()  # a copy only where needed: an export can be most of the host's memory
        storages.add(t.untyped_storage().data_ptr())
        out[name] = t
    return out


def write_safetensors(tensors: dict[str, torch.Tensor], path: str | os.PathLike,
                      metadata: dict[str, str] | None = None) -> None:
    """Write `tensors` to `path` in the safetensors format, atomically (temp file in the same folder + rename)."""
    path = Path(path)
    tensors = _dense_unshared(tensors)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        save_file(tensors, tmp, metadata=metadata)
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        os.chmod(tmp, 0o666 & ~process_umask())  # mkstemp makes it 0600
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def open_safetensors(path: Path):
    """safe_open(path); a missing, unreadable or malformed file is a ConfigError naming it."""
    try:
        return safe_open(str(path), framework="pt")
    except OSError as e:
        raise ConfigError(str(path), f"cannot read: {e.strerror or e}") from None
    except SafetensorError as e:
        raise ConfigError(str(path), f"not a valid safetensors file: {e}") from None


def read_safetensors_metadata(path: str | os.PathLike) -> dict[str, str]:
    """The `__metadata__` entry of a safetensors file ({} if none)."""
    with open_safetensors(Path(path)) as f:
        return dict(f.metadata() or {})


def read_safetensors(path: str | os.PathLike) -> dict[str, torch.Tensor]:
    """All tensors of a safetensors file, on the CPU; a malformed file is a ConfigError naming it."""
    with open_safetensors(Path(path)) as f:  # safe_open has checked the header against the file size
        return {name: f.get_tensor(name) for name in f.keys()}


def read_safetensors_header(path: str | os.PathLike) -> dict[str, tuple[tuple[int, ...], str]]:
    """{tensor name: (shape, dtype name)} from the file's header alone: no tensor data is read."""
    with open_safetensors(Path(path)) as f:
        return {name: (tuple(f.get_slice(name).get_shape()), f.get_slice(name).get_dtype()) for name in f.keys()}

