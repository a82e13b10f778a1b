"""Arguments and entry point of `llmtrain ckpt diff` (wired into the CLI by llmtrain.cli)."""

from __future__ import annotations

import argparse

from llmtrain.errors import EXIT_FAILED, EXIT_OK

EXIT_SAME, EXIT_DIFFERENT = EXIT_OK, EXIT_FAILED


def add_diff_arguments(parser: argparse.ArgumentParser) -> None:
    for name in ("a", "b"):
        parser.add_argument(name, metavar=name.upper(),
                            help="a checkpoint folder, or a run directory: its newest complete checkpoint; either "
                                 "may be an object-store URI (s3://bucket/prefix/RUN: a checkpoint location)")
    parser.add_argument("--atol", type=float, default=0.0,
                        help="largest absolute difference counted as equal (default 0: exact)")
    parser.add_argument("--model-only", action="store_true", help="compare the model only, not the optimizer state")


def _first(names: list[str]) -> str:
    return ", ".join(names[:3]) + (f" (+{len(names) - 3} more)" if len(names) > 3 else "")


def report(result, atol: float) -> list[str]:
    lines = []
    if result.differing:
        first = result.differing[0]
        if first.shapes:
            lines.append(f"first difference: {first.name}: shape {list(first.shapes[0])} in A, "
                         f"{list(first.shapes[1])} in B")
        else:
            lines.append(f"first difference: {first.name}: max |A-B| {first.max_abs:.6g} "
                         f"({first.differing:,} of {first.numel:,} values beyond atol {atol:g})")
        shapes = [d.name for d in result.differing if d.shapes]
        if shapes and not first.shapes:
            lines.append(f"shapes differ: {_first(shapes)}")
    largest, in_model = result.largest, result.largest_model
    if largest is not None and largest.max_abs > 0:
        lines.append(f"largest difference: {largest.max_abs:.6g} in {largest.name}"
                     + (f"; in the model: {in_model.max_abs:.6g} in {in_model.name}"
                        if in_model is not None and in_model is not largest and in_model.max_abs > 0 else ""))
    for side, names in (("A", result.only_a), ("B", result.only_b)):
        if names:
            lines.append(f"only in {side}: {_first(names)}")
    verdict = "identical" if result.identical else "different"
    lines.append(f"{verdict}: {result.compared} tensors compared, {len(result.differing)} differ, "
                 f"{len(result.only_a)} only in A, {len(result.only_b)} only in B (atol {atol:g})")
    return lines


def run_diff(args: argparse.Namespace) -> int:
    """0 when identical within --atol, 1 when they differ; bad input is a CheckpointUsageError (exit 2)."""
    from llmtrain.checkpoint.store import CheckpointUsageError, checkpoint_or_newest, exists

    if not args.atol >= 0:
        raise CheckpointUsageError("--atol", f"must be a number >= 0, not {args.atol}")
    paths = []
    for given in (args.a, args.b):
        path, _ = checkpoint_or_newest(given)
        if not exists(path):
            raise CheckpointUsageError(given, "no such checkpoint folder or run directory")
        paths.append(path)
    from llmtrain.checkpoint.dcp_reader import CheckpointReader
    from llmtrain.checkpoint.store import read_meta
    from llmtrain.checkpoint.tensor_diff import diff_checkpoints

    readers = [CheckpointReader(p) for p in paths]
    for side, path, reader in zip("AB", paths, readers):
        step = (read_meta(path) or {}).get("step", reader.read_value("extra.step", "?"))
        print(f"{side}: {path} (step {step})")
    result = diff_checkpoints(*readers, atol=args.atol, model_only=args.model_only)
    print("\n".join(report(result, args.atol)))
    return EXIT_SAME if result.identical else EXIT_DIFFERENT
