"""safetensors files: written atomically, read whole, or only their headers (names, shapes, dtypes).

Everything goes through the `safetensors` package; a missing, unreadable or malformed file is a ConfigError
naming it.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file

from llmtrain.config import ConfigError
from llmtrain.rundir.atomic import atomic_path, process_umask  # noqa: F401 - process_umask: for export


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
    with atomic_path(path) as tmp:
        save_file(tensors, tmp, metadata=metadata)


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
