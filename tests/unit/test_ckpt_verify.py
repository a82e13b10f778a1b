"""`llmtrain ckpt verify` and `llmtrain ckpt diff` on checkpoints the trainer saves.

The checkpoints come from a tiny GPT trained in this process (one gloo rank): steps 2 and 4. Each test that
damages one works on a copy. Across layouts (dp=2, tp=2: two processes each) is the one slow test.
"""

from __future__ import annotations

import json
import re
import shutil
import zlib
from pathlib import Path

import pytest
import torch
from helpers.ckpt_runs import TINY, cli, full_state, run, shard, train  # noqa: F401  (run: the fixture)
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint.metadata import TensorStorageMetadata


@pytest.fixture
def ckpt(run, tmp_path) -> Path:
    """A copy of step 4 to damage."""
    return Path(shutil.copytree(run / "checkpoints" / "step-0000004", tmp_path / "step-0000004"))


def update_manifest(path: Path) -> None:
    """As if the damage had been saved: meta.json records the files as they are now."""
    meta = json.loads((path / "meta.json").read_text())
    for name in meta["files"]:
        data = (path / name).read_bytes()
        meta["files"][name] = {"bytes": len(data), "crc32": zlib.crc32(data)}
    (path / "meta.json").write_text(json.dumps(meta))


# ---- verify ----------------------------------------------------------------------------------------------------


def test_a_good_checkpoint_verifies_with_one_summary_line(run, capsys):
    code, out, err = cli(capsys, "verify", str(run / "checkpoints" / "step-0000004"))
    state = FileSystemReader(str(run / "checkpoints" / "step-0000004")).read_metadata().state_dict_metadata
    tensors = sum(isinstance(m, TensorStorageMetadata) for m in state.values())
    size = sum(p.stat().st_size for p in (run / "checkpoints" / "step-0000004").iterdir() if p.name != "meta.json")
    assert code == 0 and err == ""
    assert re.fullmatch(rf"step-0000004: ok: 3 files, {size / 2**20:.1f} MiB, {tensors} tensors finite, crc32 ok, "
                        r"chunks cover every tensor, layout dp=1 tp=1 pp=1 zero=0 world_size=1; \d+\.\d\d s\n", out)


def test_a_run_dir_verifies_its_newest_or_with_all_every_checkpoint(run, capsys):
    code, out, _ = cli(capsys, "verify", str(run))
    assert code == 0 and out.startswith("step-0000004: ok") and out.count("\n") == 1
    code, out, _ = cli(capsys, "verify", "--all", str(run))
    assert code == 0 and [line.split(":")[0] for line in out.splitlines()] == ["step-0000002", "step-0000004"]


def test_a_flipped_byte_names_the_file_and_both_crcs(ckpt, capsys):
    data = bytearray(shard(ckpt).read_bytes())
    written = zlib.crc32(data)
    data[len(data) // 2] ^= 0xFF
    shard(ckpt).write_bytes(data)
    code, out, err = cli(capsys, "verify", str(ckpt))
    assert code == 1 and out == ""
    assert err == (f"llmtrain: verify failed: step-0000004/__0_0.distcp: crc32 {zlib.crc32(data):08x} != manifest "
                   f"{written:08x}\n")


def test_a_truncated_file_names_its_sizes(ckpt, capsys):
    size = shard(ckpt).stat().st_size
    with open(shard(ckpt), "r+b") as f:
        f.truncate(size - 100)
    code, _, err = cli(capsys, "verify", str(ckpt))
    assert code == 1 and err == f"llmtrain: verify failed: step-0000004/__0_0.distcp: {size - 100} bytes != " \
                                f"manifest {size}\n"


def test_a_deleted_file_is_named_missing(ckpt, capsys):
    (ckpt / "config.yaml").unlink()
    code, _, err = cli(capsys, "verify", str(ckpt))
    assert code == 1 and err == "llmtrain: verify failed: step-0000004/config.yaml: missing file\n"


def _write_nan(path: Path, key: str, count: int) -> None:
    """Overwrite the first `count` values of `key` with NaN where its bytes lie in the shard file."""
    value = full_state(path)[key]
    raw = value.numpy().tobytes()
    data = shard(path).read_bytes()
    at = data.index(raw)  # torch.save stores a tensor's bytes uncompressed
    nan = torch.full((count,), float("nan"), dtype=value.dtype).numpy().tobytes()
    shard(path).write_bytes(data[:at] + nan + data[at + len(nan):])


def test_a_saved_nan_is_named_with_its_count(ckpt, capsys):
    _write_nan(ckpt, "model.layers.1.mlp.fc.weight", 12)
    update_manifest(ckpt)  # the checksums agree: only reading the values finds it
    code, _, err = cli(capsys, "verify", str(ckpt))
    assert code == 1
    assert err == "llmtrain: verify failed: model.layers.1.mlp.fc.weight: 12 non-finite values (of 4096)\n"


def test_without_a_manifest_the_rest_is_verified_and_the_summary_says_so(ckpt, capsys):
    meta = json.loads((ckpt / "meta.json").read_text())
    del meta["files"]
    (ckpt / "meta.json").write_text(json.dumps(meta))
    code, out, _ = cli(capsys, "verify", str(ckpt))
    assert code == 0 and "checksums not checked (meta.json records none)" in out
    # A truncated shard is still found: DCP's index says where each chunk ends.
    data = shard(ckpt).read_bytes()
    shard(ckpt).write_bytes(data[:-100])
    code, _, err = cli(capsys, "verify", str(ckpt))
    assert code == 1 and err.startswith("llmtrain: verify failed: step-0000004/__0_0.distcp: truncated: ")
    assert err.endswith(f", the file has {len(data) - 100}\n")


def test_chunks_that_do_not_cover_a_tensor_are_named(ckpt, capsys):
    import pickle

    md = FileSystemReader(str(ckpt)).read_metadata()
    chunk = md.state_dict_metadata["model.embed.pos.weight"].chunks[0]
    chunk.sizes = torch.Size([16, chunk.sizes[1]])  # half the rows
    (ckpt / ".metadata").write_bytes(pickle.dumps(md))
    update_manifest(ckpt)
    code, _, err = cli(capsys, "verify", str(ckpt))
    assert code == 1 and err == "llmtrain: verify failed: model.embed.pos.weight: chunks cover 512 of 1024 " \
                                "elements of shape [32, 32]\n"


def test_overlapping_chunks_are_named(ckpt, capsys):
    import pickle

    from torch.distributed.checkpoint.metadata import ChunkStorageMetadata, MetadataIndex

    md = FileSystemReader(str(ckpt)).read_metadata()
    key = "model.embed.pos.weight"
    md.state_dict_metadata[key].chunks.append(ChunkStorageMetadata(torch.Size([16, 8]), torch.Size([8, 8])))
    md.storage_data[MetadataIndex(key, torch.Size([16, 8]))] = md.storage_data[MetadataIndex(key, torch.Size([0, 0]))]
    (ckpt / ".metadata").write_bytes(pickle.dumps(md))
    update_manifest(ckpt)
    code, _, err = cli(capsys, "verify", str(ckpt))
    assert code == 1 and err == f"llmtrain: verify failed: {key}: chunks at [0, 0] and [16, 8] overlap\n"


def test_a_layout_that_disagrees_with_config_yaml_is_named(ckpt, capsys):
    meta = json.loads((ckpt / "meta.json").read_text())
    meta["layout"]["tp"] = 2
    (ckpt / "meta.json").write_text(json.dumps(meta))
    code, _, err = cli(capsys, "verify", str(ckpt))
    assert code == 1
    assert err == "llmtrain: verify failed: step-0000004/meta.json: layout disagrees with config.yaml: tp 2 vs 1\n"


def test_a_world_size_other_than_the_ranks_that_saved_is_named(ckpt, capsys):
    meta = json.loads((ckpt / "meta.json").read_text())
    meta["layout"].update(dp=2, world_size=2)
    (ckpt / "meta.json").write_text(json.dumps(meta))
    code, _, err = cli(capsys, "verify", str(ckpt))
    assert code == 1
    assert err == "llmtrain: verify failed: step-0000004/meta.json: layout world_size 2, but ranks 0 wrote RNG state\n"


def test_an_unfinished_save_is_named_as_such(ckpt, capsys):
    unfinished = ckpt.rename(ckpt.with_name("step-0000006.tmp"))
    code, _, err = cli(capsys, "verify", str(unfinished))
    assert code == 1
    assert err == "llmtrain: verify failed: step-0000006.tmp: incomplete checkpoint: its save did not finish (a .tmp " \
                  "folder)\n"


def test_bad_input_is_one_line_exit_2(tmp_path, capsys):
    code, _, err = cli(capsys, "verify", str(tmp_path / "nothing"))
    assert code == 2 and err.count("\n") == 1 and "no such checkpoint folder or run directory" in err
    code, _, err = cli(capsys, "diff", str(tmp_path / "nothing"), str(tmp_path))
    assert code == 2 and err.count("\n") == 1 and str(tmp_path / "nothing") in err


# ---- diff ------------------------------------------------------------------------------------------------------


def test_a_checkpoint_is_identical_to_itself(run, capsys):
    code, out, _ = cli(capsys, "diff", str(run), str(run / "checkpoints" / "step-0000004"))
    compared = len(full_state(run / "checkpoints" / "step-0000004"))
    assert code == 0
    assert out.splitlines()[-1] == f"identical: {compared} tensors compared, 0 differ, 0 only in A, 0 only in B " \
                                   "(atol 0)"


def _natural(name: str) -> list:
    return [int(p) if p.isdigit() else p for p in re.split(r"(\d+)", name)]


@pytest.mark.parametrize("model_only", [False, True])
def test_two_steps_name_the_first_difference_and_the_largest(run, capsys, model_only):
    a, b = full_state(run / "checkpoints" / "step-0000002"), full_state(run / "checkpoints" / "step-0000004")
    if model_only:
        a, b = ({k: v for k, v in s.items() if k.startswith("model.")} for s in (a, b))
    diffs = {k: float((a[k].double() - b[k].double()).abs().max()) for k in a}
    first = next(k for k in sorted(a, key=_natural) if diffs[k] > 0)
    largest = max(sorted(a, key=_natural), key=diffs.get)  # a tie: the first in order
    differing = sum(d > 0 for d in diffs.values())
    flags = ["--model-only"] if model_only else []
    code, out, _ = cli(capsys, "diff", *flags, str(run / "checkpoints" / "step-0000002"), str(run))
    lines = out.splitlines()
    assert code == 1
    assert lines[:2] == [f"A: {run / 'checkpoints' / 'step-0000002'} (step 2)",
                         f"B: {run / 'checkpoints' / 'step-0000004'} (step 4)"]
    assert lines[2].startswith(f"first difference: {first}: max |A-B| {diffs[first]:.6g} (")
    in_model = max((k for k in sorted(a, key=_natural) if k.startswith("model.")), key=diffs.get)
    assert lines[3] == f"largest difference: {diffs[largest]:.6g} in {largest}" + \
        ("" if largest == in_model else f"; in the model: {diffs[in_model]:.6g} in {in_model}")
    assert model_only or largest.startswith("optim.")  # AdamW's step counts: 2 apart
    assert lines[4] == f"different: {len(a)} tensors compared, {differing} differ, 0 only in A, 0 only in B (atol 0)"
    # Within an atol above the largest difference they count as identical.
    code, out, _ = cli(capsys, "diff", *flags, "--atol", f"{diffs[largest] * 1.01}",
                       str(run / "checkpoints" / "step-0000002"), str(run))
    assert code == 0 and out.splitlines()[-1].startswith(f"identical: {len(a)} tensors compared, 0 differ")


def test_another_model_shape_is_named_and_missing_tensors_counted(run, tmp_path, capsys):
    other = tmp_path / "other"
    other.mkdir()
    train(other, overrides=("model.n_layers=1", "model.seq_len=16", "train.max_steps=1"))
    code, out, _ = cli(capsys, "diff", "--model-only", str(run), str(other))
    ours = [k for k in full_state(run / "checkpoints" / "step-0000004") if k.startswith("model.")]
    only_a = sorted((k for k in ours if k.startswith("model.layers.1.")), key=_natural)
    assert code == 1
    assert "first difference: model.embed.pos.weight: shape [32, 32] in A, [16, 32] in B" in out
    assert f"only in A: {', '.join(only_a[:3])} (+{len(only_a) - 3} more)" in out
    assert out.splitlines()[-1].startswith(f"different: {len(ours) - len(only_a)} tensors compared, ")
    assert f", {len(only_a)} only in A, 0 only in B (atol 0)" in out


def test_values_compare_with_nan_equal_to_nan_and_inf_against_a_number():
    from llmtrain.checkpoint.tensor_diff import compare

    nan, inf = float("nan"), float("inf")
    same = compare("t", torch.tensor([1.0, nan, inf]), torch.tensor([1.0, nan, inf]), atol=0.0)
    assert (same.max_abs, same.differing, same.numel) == (0.0, 0, 3)
    off = compare("t", torch.tensor([1.0, nan, 2.0, 3.0]), torch.tensor([1.5, 0.0, 2.25, 3.0]), atol=0.3)
    assert (off.max_abs, off.differing) == (inf, 2)  # 0.5 and the NaN are beyond 0.3; 0.25 is not
    bf16 = compare("t", torch.tensor([1.0], dtype=torch.bfloat16), torch.tensor([1.0078125]), atol=0.0)
    assert bf16.max_abs == 0.0078125  # other dtypes compare by value


# ---- layouts (several processes) -------------------------------------------------------------------------------


