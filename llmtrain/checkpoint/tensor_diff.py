"""`llmtrain ckpt diff`: the model (and optimizer) tensors of two checkpoints compared, one pair at a time.

Both are read as full tensors (DCP reshards whatever layouts wrote them), so a dp=2 checkpoint compares with a
tp=2 one. Tensors are matched by name and visited in natural order (layers.2 before layers.10): the first one
that differs is the same on every run. RNG state and counters (extra.*) are not compared: they differ by layout.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from llmtrain.checkpoint.dcp_reader import CheckpointReader, groups, natural_key
from llmtrain.checkpoint.weight_map import clean_name

MODEL, OPTIM = "model.", "optim."


@dataclass
class TensorDiff:
    name: str
    max_abs: float  # inf where one side is NaN/Inf and the other is not
    differing: int  # elements beyond atol
    numel: int
    shapes: tuple | None = None  # (shape in A, shape in B) when they differ


@dataclass
class DiffResult:
    compared: int = 0
    differing: list[TensorDiff] = field(default_factory=list)
    only_a: list[str] = field(default_factory=list)
    only_b: list[str] = field(default_factory=list)
    largest: TensorDiff | None = None  # the largest absolute difference over every tensor of equal shape
    largest_model: TensorDiff | None = None  # the same over the model's tensors (AdamW's step counts dwarf them)

    @property
    def identical(self) -> bool:
        return not (self.differing or self.only_a or self.only_b)


def compared_tensors(reader: CheckpointReader, model_only: bool) -> dict[str, str]:
    """{name compared (wrapper prefixes removed): stored key}."""
    keys = reader.tensors((MODEL,) if model_only else (MODEL, OPTIM))
    return {clean_name(k): k for k in keys}


def diff_checkpoints(a: CheckpointReader, b: CheckpointReader, atol: float = 0.0,
                     model_only: bool = False) -> DiffResult:
    names_a, names_b = compared_tensors(a, model_only), compared_tensors(b, model_only)
    result = DiffResult(only_a=sorted(set(names_a) - set(names_b), key=natural_key),
                        only_b=sorted(set(names_b) - set(names_a), key=natural_key))
    stored_a, stored_b = a.metadata.state_dict_metadata, b.metadata.state_dict_metadata
    common = sorted(set(names_a) & set(names_b), key=natural_key)
    shapes = {n: (tuple(stored_a[names_a[n]].size), tuple(stored_b[names_b[n]].size)) for n in common}
    same = [n for n in common if shapes[n][0] == shapes[n][1]]
    # One pair at a time; from an object store in groups (each load there costs round trips).
    sizes = [max(a.nbytes(names_a[n]), b.nbytes(names_b[n])) for n in same]
    pairs: dict[str, tuple] = {}
    batches = groups(same, sizes, a.remote or b.remote)
    for name in common:
        shape_a, shape_b = shapes[name]
        result.compared += 1
        if shape_a != shape_b:
            result.differing.append(TensorDiff(name, float("nan"), 0, 0, (shape_a, shape_b)))
            continue
        if name not in pairs:
            pairs = _read_pairs(a, b, names_a, names_b, next(batches))
        diff = compare(name, *pairs.pop(name), atol)
        if result.largest is None or diff.max_abs > result.largest.max_abs:
            result.largest = diff
        if names_a[name].startswith(MODEL) and (result.largest_model is None or
                                                diff.max_abs > result.largest_model.max_abs):
            result.largest_model = diff
        if diff.differing:
            result.differing.append(diff)
    return result


def _read_pairs(a: CheckpointReader, b: CheckpointReader, names_a: dict, names_b: dict,
                names: list[str]) -> dict[str, tuple]:
    """{name: (tensor in A, tensor in B)} of `names`, each side in one load."""
    xs, ys = a.read_many([names_a[n] for n in names]), b.read_many([names_b[n] for n in names])
    return {n: (xs[names_a[n]], ys[names_b[n]]) for n in names}


def compare(name: str, x: torch.Tensor, y: torch.Tensor, atol: float, block: int = 1 << 22) -> TensorDiff:
    """|x - y| in float64, a block of elements at a time (an embedding's float64 copies would be large); NaN
    equals NaN and Inf the same Inf, a NaN or Inf against anything else is an infinite difference."""
    x, y = x.reshape(-1), y.reshape(-1)
    max_abs, differing = 0.0, 0
    for start in range(0, x.numel(), block):
        xs, ys = x[start:start + block].to(torch.float64), y[start:start + block].to(torch.float64)
        same = (xs == ys) | (torch.isnan(xs) & torch.isnan(ys))
        delta = torch.where(same, 0.0, (xs - ys).abs().nan_to_num(nan=float("inf")))
        max_abs = max(max_abs, float(delta.max()))
        differing += int((delta > atol).sum())
    return TensorDiff(name, max_abs, differing, x.numel())
