"""`llmtrain ckpt verify`: re-read a checkpoint against what its save recorded, cheapest checks first.

1. files: each file of meta.json's manifest present, with its size and CRC32 (a checkpoint saved without a
   manifest gets the other checks, and the summary says its checksums could not be checked);
2. layout: DCP's .metadata readable; each tensor's chunks cover its global shape exactly, without overlap, and each
   chunk lies inside an existing shard file; meta.json's step and layout agree with the folder name, the stored
   step, the ranks that wrote RNG state and config.yaml; the model tensors have the shapes config.yaml builds;
3. values: every floating tensor read back, one at a time, and finite.
The first problem found is a VerifyError naming the file or tensor. The folder may be local or on an object store:
every listing and read goes through its storage (checkpoint/storage).
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass

import torch
from omegaconf import OmegaConf

from llmtrain.checkpoint import store
from llmtrain.checkpoint.dcp_reader import CheckpointReader, first_line, groups
from llmtrain.checkpoint.storage import is_uri, storage_for
from llmtrain.errors import ConfigError, VerifyError  # VerifyError: a failed check, `key` the file or tensor


@dataclass
class Summary:
    files: int
    bytes: int
    tensors: int
    checksummed: bool
    layout: dict | None
    seconds: float = 0.0


def verify_checkpoint(path: str) -> Summary:
    t0 = time.perf_counter()
    storage = storage_for(path)
    name = storage.basename(path)
    if name.endswith(".tmp"):
        raise VerifyError(name, "incomplete checkpoint: its save did not finish (a .tmp folder)")
    meta = store.read_meta(path)
    if not isinstance(meta, dict):
        raise VerifyError(f"{name}/{store.META}", "missing file" if not storage.isfile(storage.join(path, store.META))
                          else "unreadable (not a JSON object)")
    files, size, checksummed = check_files(path, name, meta)
    try:
        reader = CheckpointReader(path)
    except store.CheckpointError as e:
        raise VerifyError(f"{name}/{store.DCP_METADATA}", e.message) from None
    check_chunks(reader, name)
    try:
        check_records(reader, name, meta)
        tensors = check_finite(reader)
    except store.CheckpointError as e:  # a shard DCP cannot read (without a manifest to name it first)
        raise VerifyError(f"{name}/{_relative(e.key, path)}", e.message) from None
    return Summary(files, size, tensors, checksummed, meta.get("layout"), time.perf_counter() - t0)


def _relative(key: str, path: str) -> str:
    """`key` (a file of the checkpoint) relative to the folder `path`."""
    if is_uri(path):
        return key[len(path.rstrip("/")):].lstrip("/") if key.startswith(path.rstrip("/")) else key
    return os.path.relpath(key, path)


def check_files(path: str, name: str, meta: dict) -> tuple[int, int, bool]:
    """(files, bytes, whether CRC32s were checked) of the manifest; without one, of the folder's files."""
    manifest = meta.get("files")
    storage = storage_for(path)
    sizes = storage.sizes(path)  # one listing of the folder's files, also on an object store
    if not manifest:
        present = [f for f in sizes if f != store.META]
        return len(present), sum(sizes[f] for f in present), False
    for file, expect in sorted(manifest.items()):
        if not (isinstance(expect, dict) and isinstance(expect.get("bytes"), int)
                and isinstance(expect.get("crc32"), int)):
            raise VerifyError(f"{name}/{store.META}", f"manifest entry of {file} lacks its bytes or crc32")
        full = storage.join(path, file)
        if file not in sizes:
            raise VerifyError(f"{name}/{file}", "missing file")
        size = sizes[file]
        if size != expect["bytes"]:
            raise VerifyError(f"{name}/{file}", f"{size} bytes != manifest {expect['bytes']}")
        crc = store.file_crc32(full)
        if crc != expect["crc32"]:
            raise VerifyError(f"{name}/{file}", f"crc32 {crc:08x} != manifest {expect['crc32']:08x}")
    return len(manifest), sum(e["bytes"] for e in manifest.values()), True


def check_chunks(reader: CheckpointReader, name: str) -> None:
    """Every tensor's chunks tile its global shape, and every chunk's bytes lie inside an existing file."""
    stored = {(index.fqn, tuple(index.offset) if index.offset is not None else None): info
              for index, info in reader.metadata.storage_data.items()}
    sizes = reader.storage.sizes(reader.path)  # one listing of the shard files
    for key, md in reader.tensors().items():
        shape = tuple(md.size)
        covered = 0
        boxes = [(tuple(c.offsets), tuple(c.sizes)) for c in md.chunks]
        for offsets, lengths in boxes:
            if len(offsets) != len(shape) or any(o < 0 or o + n > s for o, n, s in zip(offsets, lengths, shape)):
                raise VerifyError(key, f"chunk at {list(offsets)} of size {list(lengths)} lies outside the tensor's "
                                       f"shape {list(shape)}")
            covered += math.prod(lengths)
            info = stored.get((key, offsets))
            if info is None:
                raise VerifyError(key, f"chunk at {list(offsets)} is in no shard file (.metadata has no storage "
                                       "entry for it)")
            _check_in_file(name, key, info, sizes)
        overlap = _first_overlap(boxes)
        if overlap:
            raise VerifyError(key, f"chunks at {list(overlap[0])} and {list(overlap[1])} overlap")
        if covered != math.prod(shape):
            raise VerifyError(key, f"chunks cover {covered} of {math.prod(shape)} elements of shape {list(shape)}")


def _first_overlap(boxes: list[tuple[tuple, tuple]]) -> tuple[tuple, tuple] | None:
    """The offsets of two chunks that share an element, or None. A sweep along dim 0 compares a chunk only with
    those whose rows reach it: near-linear for the thousand chunks of a large job's sharding, not quadratic."""
    active: list[tuple[tuple, tuple]] = []
    for offsets, lengths in sorted(box for box in boxes if math.prod(box[1])):
        start = offsets[0] if offsets else 0
        active = [(o, n) for o, n in active if not o or o[0] + n[0] > start]
        for other, other_lengths in active:
            if all(a < b + m and b < a + n for a, n, b, m in zip(offsets, lengths, other, other_lengths)):
                return other, offsets
        active.append((offsets, lengths))
    return None


def _check_in_file(name: str, key: str, info, sizes: dict[str, int]) -> None:
    file = info.relative_path
    if file not in sizes:
        raise VerifyError(f"{name}/{file}", f"missing file (holds {key})")
    if info.offset + info.length > sizes[file]:
        raise VerifyError(f"{name}/{file}", f"truncated: {key} ends at byte {info.offset + info.length}, the file "
                                            f"has {sizes[file]}")


def check_records(reader: CheckpointReader, name: str, meta: dict) -> None:
    """meta.json against the folder name, the stored state and config.yaml."""
    step = meta.get("step")
    if name.startswith("step-") and name[5:].isdigit() and step is not None and int(name[5:]) != step:
        raise VerifyError(f"{name}/{store.META}", f"step {step} but the folder is {name}")
    stored_step = reader.read_value("extra.step")
    if step is not None and stored_step is not None and int(stored_step) != step:
        raise VerifyError(f"{name}/{store.META}", f"step {step} but the checkpoint's state holds step {stored_step}")
    layout = meta.get("layout")
    ranks = sorted(int(k[len("rng.rank"):]) for k in reader.metadata.state_dict_metadata if k.startswith("rng.rank"))
    if layout and ranks and ranks != list(range(layout["world_size"])):
        raise VerifyError(f"{name}/{store.META}", f"layout world_size {layout['world_size']}, but ranks "
                                                  f"{_ranges(ranks)} wrote RNG state")
    cfg_path = reader.storage.join(reader.path, "config.yaml")
    if not reader.storage.isfile(cfg_path):
        return  # a checkpoint without its config: nothing to compare with
    from llmtrain.checkpoint.export import load_checkpoint_config
    from llmtrain.checkpoint.manager import layout_of
    from llmtrain.checkpoint.weight_map import clean_name, model_shapes
    from llmtrain.config import load_run_config

    try:
        cfg = load_checkpoint_config(reader.path) if is_uri(cfg_path) else load_run_config(cfg_path)
        cfg_layout, cfg_model = layout_of(cfg), OmegaConf.to_container(cfg.model, resolve=True)
        shapes = model_shapes(cfg.model)
    except (ConfigError, ValueError, KeyError, AttributeError) as e:
        raise VerifyError(f"{name}/config.yaml", f"unreadable ({first_line(e)})") from None
    # Only the keys meta.json has: an older save may lack keys added since.
    layout_diff = [k for k in sorted(layout or {}) if layout[k] != cfg_layout.get(k)]
    if layout_diff:
        what = ", ".join(f"{k} {layout[k]} vs {cfg_layout.get(k)}" for k in layout_diff)
        raise VerifyError(f"{name}/{store.META}", f"layout disagrees with config.yaml: {what}")
    model_diff = [k for k in sorted(meta.get("model") or {}) if meta["model"][k] != cfg_model.get(k)]
    if model_diff:
        raise VerifyError(f"{name}/{store.META}", f"model disagrees with config.yaml: {', '.join(model_diff)}")
    stored = {clean_name(k[len("model."):]): md for k, md in reader.tensors(("model.",)).items()}
    for param, shape in shapes.items():
        md = stored.get(param)
        if md is None:
            raise VerifyError(f"model.{param}", "missing from the checkpoint (config.yaml's model has it)")
        if tuple(md.size) != shape:
            raise VerifyError(f"model.{param}", f"shape {list(md.size)} != {list(shape)} from config.yaml")


def _ranges(ranks: list[int]) -> str:
    return ",".join(map(str, ranks[:8])) + ("..." if len(ranks) > 8 else "")


def check_finite(reader: CheckpointReader) -> int:
    """Read every tensor back (one at a time; on an object store in groups of up to GROUP_BYTES); a floating one
    with a NaN or Inf is named. Returns how many."""
    keys = list(reader.tensors())
    for group in groups(keys, [reader.nbytes(k) for k in keys], reader.remote):
        for key, tensor in reader.read_many(group).items():
            if tensor.is_floating_point():
                bad = int(tensor.numel() - torch.isfinite(tensor).sum())
                if bad:
                    raise VerifyError(key, f"{bad} non-finite value{'s' if bad > 1 else ''} (of {tensor.numel()})")
    return len(keys)
