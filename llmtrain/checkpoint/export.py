"""Export a DCP checkpoint to safetensors (llmtrain names) or a Hugging Face folder of the model's family.

A checkpoint folder (CKPT/) holds the DCP files, the run's config.yaml and meta.json; its model tensors are stored
under "model.<parameter name>" whatever the parallel layout was, so one process without a process group can read
them back as full (consolidated) tensors. The Hugging Face names and config.json come from the family's adapter
(llmtrain/model/<family>/hf.py); loading such folders back (model.init_from) is pretrained.py.

The checkpoint may be local or on an object store (read through its storage), and so may the export: an export to a
URI is written into a local temporary folder, then uploaded file by file, the file that marks it complete last
(COMPLETES_EXPORT).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import warnings
from pathlib import Path

import torch
from omegaconf import DictConfig, OmegaConf

# read_safetensors and read_safetensors_metadata: also imported from here by callers of the export.
from llmtrain.checkpoint.safetensors_io import (process_umask, read_safetensors,  # noqa: F401
                                                read_safetensors_metadata, write_safetensors)
from llmtrain.checkpoint.weight_map import EMBED, HEAD, clean_name, state_shapes
from llmtrain.checkpoint.storage import is_uri, storage_for
from llmtrain.config import ConfigError, load_run_config, to_yaml
from llmtrain.config.compose import to_typed
from llmtrain.config.derived import padded_vocab_size
from llmtrain.model.registry import family_of
from llmtrain.rundir.atomic import publish_dir

FORMATS = ("safetensors", "hf")
MODEL_PREFIX = "model."
CONFIG_FILE = "config.yaml"
METADATA_FILE = ".metadata"
SAFETENSORS_FILE = "model.safetensors"
HF_CONFIG_FILE = "config.json"
# Uploaded last to a URI, so that a folder holding it is a whole export: what a reader looks for first
# (transformers' and model.init_from's config.json; an llmtrain export's weights file).
COMPLETES_EXPORT = {"hf": HF_CONFIG_FILE, "safetensors": SAFETENSORS_FILE}


# ---- reading a DCP checkpoint --------------------------------------------------------------------------------


def load_checkpoint_config(ckpt_dir: str | os.PathLike) -> DictConfig:
    """The run config saved with a checkpoint (a folder or an object-store URI); ConfigError for a missing folder
    or config.yaml."""
    ckpt = os.fspath(ckpt_dir)
    storage = storage_for(ckpt)
    if not storage.isdir(ckpt):
        if storage.isfile(ckpt):
            raise ConfigError(ckpt, "not a checkpoint folder (expected a folder with DCP files and config.yaml)")
        raise ConfigError(ckpt, "no such checkpoint folder")
    cfg_path = storage.join(ckpt, CONFIG_FILE)
    if not storage.isfile(cfg_path):
        raise ConfigError(cfg_path, "missing: a checkpoint folder holds the run's config.yaml next to its "
                                    "DCP files (is this a complete checkpoint folder?)")
    if storage.renames:
        return load_run_config(cfg_path)
    try:
        return to_typed(OmegaConf.create(storage.read_text(cfg_path)))
    except ConfigError:
        raise
    except Exception as e:
        raise ConfigError(cfg_path, f"unreadable config: {str(e).strip().splitlines()[0][:200]}") from None


def _in_checkpoint(ckpt: str, name: str) -> str:
    """A file of checkpoint folder `ckpt` as messages name it (a local folder's as pathlib writes it)."""
    return storage_for(ckpt).join(ckpt.rstrip("/"), name) if is_uri(ckpt) else str(Path(ckpt) / name)


def _read_dcp_metadata(ckpt: str):
    storage = storage_for(ckpt)
    meta_path = _in_checkpoint(ckpt, METADATA_FILE)
    if not storage.isfile(meta_path):
        raise ConfigError(str(meta_path), "missing: not a torch.distributed.checkpoint folder, or an incomplete one")
    try:
        return storage.dcp_reader(ckpt).read_metadata()
    except Exception as e:  # truncated pickle, garbage, wrong version, ...
        msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ConfigError(str(meta_path), f"unreadable or corrupt DCP metadata ({type(e).__name__}: {msg})") from None


def load_model_state(ckpt_dir: str | os.PathLike) -> tuple[dict[str, torch.Tensor], DictConfig]:
    """Full fp32 model tensors of a DCP checkpoint with llmtrain names (no "model." prefix), and its run config:
    the parameters and the persistent buffers (a mixture-of-experts layer's routing bias), as load_state_dict takes.

    Runs in one process without a process group; DCP reassembles whatever shards the run's layout wrote. A tied
    head is the embedding, so then only embed.tok.weight is returned (a stored head.weight is dropped).
    """
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    from llmtrain.checkpoint.dcp_reader import dcp_failure

    ckpt = _checkpoint_name(ckpt_dir)
    cfg = load_checkpoint_config(ckpt)
    metadata = _read_dcp_metadata(ckpt)

    stored: dict[str, tuple[str, TensorStorageMetadata]] = {}  # clean name -> (stored key, metadata)
    for key, md in metadata.state_dict_metadata.items():
        if key.startswith(MODEL_PREFIX) and isinstance(md, TensorStorageMetadata):
            stored.setdefault(clean_name(key[len(MODEL_PREFIX):]), (key[len(MODEL_PREFIX):], md))
    if not stored:
        raise ConfigError(_in_checkpoint(ckpt, METADATA_FILE), "no model tensors in this checkpoint (no 'model.*' "
                                                               "keys)")

    params, buffers = state_shapes(cfg.model)
    expected = {**params, **buffers}
    for name, shape in expected.items():
        if name not in stored:
            raise ConfigError(str(ckpt), f"model tensor {name} is missing from the checkpoint")
        got = tuple(stored[name][1].size)
        if got != shape:
            raise ConfigError(str(ckpt), f"shape mismatch for {name}: checkpoint {got} vs its config.yaml {shape}")

    request = {stored[n][0]: torch.empty(tuple(stored[n][1].size), dtype=stored[n][1].properties.dtype)
               for n in expected}
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "assuming the intent is to load in a single process"
            dcp.load({"model": request}, storage_reader=storage_for(ckpt).dcp_reader(ckpt), no_dist=True)
    except (Exception, CheckpointException) as e:  # DCP wraps a shard's failure in a BaseException
        e = dcp_failure(e)
        if not isinstance(e, Exception):  # Ctrl-C while reading, passed through DCP
            raise e from None
        msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ConfigError(str(ckpt), f"cannot read the DCP shard files ({type(e).__name__}: {msg[:500]})") from None
    tensors = {n: request[stored[n][0]] for n in expected}
    return {n: (t.float() if t.is_floating_point() else t) for n, t in tensors.items()}, cfg


def _checkpoint_name(ckpt_dir: str | os.PathLike) -> str:
    """A checkpoint folder as messages name it: a local one as pathlib writes it, a URI as given."""
    ckpt = os.fspath(ckpt_dir)
    return ckpt.rstrip("/") if is_uri(ckpt) else str(Path(ckpt))


def _read_meta_json(ckpt: str) -> dict:
    storage = storage_for(ckpt)
    try:
        meta = json.loads(storage.read_bytes(storage.join(ckpt, "meta.json")))
        return meta if isinstance(meta, dict) else {}
    except (OSError, ValueError):
        return {}


def check_hf_exportable(model_cfg) -> None:
    """ConfigError unless `--format hf` can hold this model (the family's adapter says). Reads the config only."""
    spec = family_of(model_cfg)
    if spec.hf_adapter() is None:
        raise ConfigError("--format", f"{spec.setting} has no Hugging Face format; use --format safetensors")
    spec.hf_adapter().check_exportable(model_cfg)


def _hf_files(tensors: dict[str, torch.Tensor], params: set[str], model_cfg) -> dict:
    """The family adapter's names (a stacked parameter may become several tensors) and config.json. Hugging Face
    models have parameters only: a persistent buffer is left out while it holds zeros (its initial value)."""
    spec = family_of(model_cfg)
    for name, t in tensors.items():
        if name not in params and torch.count_nonzero(t):
            raise ConfigError("--format", f"{name} is not zero and Hugging Face {spec.title} has no place for it; "
                                          f"use --format safetensors")
    adapter = spec.hf_adapter()
    return {SAFETENSORS_FILE: adapter.to_hf_state({n: t for n, t in tensors.items() if n in params}, model_cfg),
            HF_CONFIG_FILE: json.dumps(adapter.hf_config(model_cfg), indent=2) + "\n"}


# ---- export --------------------------------------------------------------------------------------------------


def _check_out_dir(out: Path | str) -> None:
    if isinstance(out, str):  # a URI: a prefix without objects is a new folder
        storage = storage_for(out)
        if storage.listdir(out) or storage.isfile(out):
            raise ConfigError("--out", f"{out} exists and is not empty; choose a new or empty folder")
        return
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        what = "is not a folder" if not out.is_dir() else "exists and is not empty"
        raise ConfigError("--out", f"{out} {what}; choose a new or empty folder")


def _write_files(files: dict, folder: Path, meta: dict) -> None:
    for name, content in files.items():
        if isinstance(content, dict):
            write_safetensors(content, folder / name, meta)
        else:
            (folder / name).write_text(content)


def _upload(files: dict, fmt: str, out: str, meta: dict) -> None:
    """The export written into a local temporary folder, then uploaded to `out` one file at a time,
    COMPLETES_EXPORT[fmt] last: a failure before it leaves no folder that reads as a finished export, and what
    was uploaded is removed."""
    storage = storage_for(out)
    last = COMPLETES_EXPORT[fmt]
    order = sorted(files, key=lambda name: (name == last, name))
    uploaded = []
    with tempfile.TemporaryDirectory(prefix="llmtrain-export-") as tmp:
        _write_files(files, Path(tmp), meta)
        _check_out_dir(out)  # again: something may have appeared meanwhile
        try:
            for name in order:
                uploaded.append(storage.join(out, name))
                storage.put_file(os.path.join(tmp, name), uploaded[-1])
        except BaseException:
            for path in uploaded:
                try:
                    storage.remove(path)
                except Exception:  # noqa: BLE001 - the upload's own error is the one to report
                    pass
            raise


def export_checkpoint(ckpt_dir: str | os.PathLike, fmt: str, out_dir: str | os.PathLike) -> dict:
    """Write the checkpoint's model as `fmt` ("safetensors" or "hf") into the new folder `out_dir` (a path, or an
    object-store URI).

    Everything is written into a temporary folder next to out_dir and renamed at the end, so a failure leaves
    nothing behind; to a URI, the files are uploaded from a local temporary folder, COMPLETES_EXPORT last. Returns
    a summary: {"out", "format", "kind" (what was written, in words), "files", "num_params"}.
    """
    if fmt not in FORMATS:
        raise ConfigError("--format", f"unknown format {fmt!r} (choose from {', '.join(FORMATS)})")
    ckpt = _checkpoint_name(ckpt_dir)
    out = os.fspath(out_dir).rstrip("/") if is_uri(os.fspath(out_dir)) else Path(out_dir)
    _check_out_dir(out)
    cfg = load_checkpoint_config(ckpt)
    if fmt == "hf":
        check_hf_exportable(cfg.model)
    tensors, cfg = load_model_state(ckpt)
    params = set(state_shapes(cfg.model)[0])
    vocab = cfg.model.vocab_size
    # Parameters as exported: the vocabulary's padding rows (of the embedding, and of an untied head) are cut off.
    num_params = sum(t[:vocab].numel() if n in (EMBED, HEAD) else t.numel() for n, t in tensors.items()
                     if n in params)

    meta = {"format": "pt", "producer": "llmtrain", "source": ckpt if is_uri(ckpt) else str(Path(ckpt).resolve())}
    run_meta = _read_meta_json(ckpt)
    if "step" in run_meta:
        meta["step"] = str(run_meta["step"])
    if fmt == "safetensors":
        st = {n: (t[:vocab].contiguous() if n in (EMBED, HEAD) else t) for n, t in tensors.items()}
        meta.update(layout="llmtrain", vocab_size=str(vocab), padded_vocab_size=str(padded_vocab_size(cfg.model)))
        files = {SAFETENSORS_FILE: st, CONFIG_FILE: to_yaml(cfg)}
    else:
        meta.update(layout=f"hf-{family_of(cfg.model).name}")
        files = _hf_files(tensors, params, cfg.model)

    kind = f"Hugging Face {family_of(cfg.model).title} folder" if fmt == "hf" else "llmtrain safetensors"
    summary = {"out": str(out), "format": fmt, "kind": kind, "files": sorted(files), "num_params": num_params}
    if isinstance(out, str):
        _upload(files, fmt, out, meta)
        return summary
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent))
    try:
        os.chmod(tmp, 0o777 & ~process_umask())  # mkdtemp makes it 0700
        _write_files(files, tmp, meta)
        _check_out_dir(out)  # again: something may have appeared meanwhile
        if out.is_dir():
            out.rmdir()  # empty: replaced by the finished folder
        publish_dir(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return summary
