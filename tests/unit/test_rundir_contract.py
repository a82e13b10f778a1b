"""llmtrain.rundir: the run directory's layout (paths match docs/guarantees.md), atomic writes (a failed write leaves
the old content and no temp file), the ranks' status and place files and job.json (exact bytes, round trips), and
that no module above it builds those paths or renames temp files by hand."""

from __future__ import annotations

import ast
import json
import os
import re
import stat
from pathlib import Path

import pytest

from llmtrain.checkpoint import store
from llmtrain.rundir import atomic, job_record, paths, rank_files
from llmtrain.rundir.atomic import atomic_path, atomic_write_bytes, atomic_write_json, atomic_write_text, atomic_writer
from llmtrain.rundir.paths import RunPaths

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "llmtrain"


class Boom(Exception):
    pass


# ------------------------------------------------------------------------------------------------- atomic writes

def test_a_writer_that_fails_midway_leaves_the_old_content_and_no_temp_file(tmp_path):
    target = tmp_path / "config.yaml"
    target.write_bytes(b"old: 1\n")
    with pytest.raises(Boom):
        with atomic_writer(target, "w") as f:
            f.write("new: ")
            f.flush()
            raise Boom
    assert target.read_bytes() == b"old: 1\n"
    assert os.listdir(tmp_path) == ["config.yaml"]


def test_a_value_that_cannot_be_encoded_leaves_the_old_json(tmp_path):
    target = tmp_path / "job.json"
    target.write_bytes(b'{"launches": []}')
    with pytest.raises(TypeError):
        atomic_write_json(target, {"launches": [object()]})
    assert target.read_bytes() == b'{"launches": []}'
    assert os.listdir(tmp_path) == ["job.json"]


def test_a_failed_rename_leaves_the_old_content_and_no_temp_file(tmp_path, monkeypatch):
    target = tmp_path / "trackers.json"
    target.write_bytes(b"{}")

    def full_disk(src, dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(atomic.os, "replace", full_disk)
    # Named with the file it kept from being written, and still an OSError with its errno.
    with pytest.raises(OSError, match=f"^no space left on device writing {re.escape(str(target))}$") as e:
        atomic_write_text(target, '{"wandb": "abc"}')
    assert e.value.errno == 28
    assert target.read_bytes() == b"{}"
    assert os.listdir(tmp_path) == ["trackers.json"]


def test_a_writer_by_name_fails_and_leaves_nothing_behind(tmp_path):
    target = tmp_path / "loss.png"
    with pytest.raises(Boom):
        with atomic_path(target) as tmp:
            Path(tmp).write_bytes(b"half a png")
            raise Boom
    assert os.listdir(tmp_path) == []


def test_atomic_writes_give_the_exact_bytes_and_plain_open_permissions(tmp_path):
    atomic_write_json(tmp_path / "a.json", {"b": 1, "a": [1, 2]}, indent=1, sort_keys=True)
    atomic_write_bytes(tmp_path / "b.bin", b"\x00\xff\n")
    atomic_write_text(tmp_path / "c.txt", "x\n")
    assert (tmp_path / "a.json").read_bytes() == b'{\n "a": [\n  1,\n  2\n ],\n "b": 1\n}'
    assert (tmp_path / "b.bin").read_bytes() == b"\x00\xff\n"
    assert (tmp_path / "c.txt").read_bytes() == b"x\n"
    # mkstemp's 0600 is not what a plain open() gives: readers on other accounts (Slurm, NFS) must still read.
    mode = stat.S_IMODE((tmp_path / "a.json").stat().st_mode)
    assert mode == 0o666 & ~atomic.process_umask()
    assert sorted(os.listdir(tmp_path)) == ["a.json", "b.bin", "c.txt"]


def test_a_replaced_file_is_a_new_inode_so_an_open_reader_keeps_the_old_content(tmp_path):
    target = tmp_path / "config.yaml"
    target.write_text("old\n")
    with open(target) as reader:
        atomic_write_text(target, "new\n")
        assert reader.read() == "old\n"
    assert target.read_text() == "new\n"


def test_publish_dir_renames_a_finished_folder_over_an_empty_one(tmp_path):
    (tmp_path / "out.tmp").mkdir()
    (tmp_path / "out.tmp" / "f").write_text("1")
    (tmp_path / "out").mkdir()
    atomic.publish_dir(tmp_path / "out.tmp", tmp_path / "out")
    assert os.listdir(tmp_path) == ["out"] and (tmp_path / "out" / "f").read_text() == "1"


# ---------------------------------------------------------------------------------------------------- layout

def documented_layout() -> list[str]:
    """The entries of docs/guarantees.md's "Run directory" block, relative to RUN_DIR."""
    text = (REPO / "docs" / "guarantees.md").read_text()
    block = text.split("## Run directory", 1)[1].split("```", 2)[1]
    return [line.split()[0] for line in block.splitlines()[1:]
            if line.startswith("  ") and not line.strip().startswith("#")]  # "#": a comment's second line


def docstring_layout() -> list[str]:
    doc = paths.__doc__.split("RUN_DIR/", 1)[1]
    return [line.split()[0] for line in doc.splitlines() if line.startswith("      ") and line.strip()]


def test_the_module_lists_the_layout_the_guarantees_document():
    assert docstring_layout() == documented_layout()
    assert {"config.yaml", "metrics.jsonl", "job.json", "nodes.json"} <= set(documented_layout())


def test_every_documented_path_is_named_by_run_paths():
    p = RunPaths("RUN_DIR")
    named = {
        "config.yaml": p.config, "metrics.jsonl": p.metrics, "logs/rank{R}.log": p.rank_log("{R}"),
        "logs/rank{R}.status": p.rank_status("{R}"), "logs/rank{R}.place": p.rank_place("{R}"),
        "logs/node{N}.log": p.node_log("{N}"), "logs/node{N}.env": p.node_env("{N}"),
        "logs/combined.log": p.combined_log, "logs/slurm-{JOB}.out": p.slurm_output("{JOB}"), ".lock": p.lock,
        "job.json": p.job_record, "nodes.json": p.nodes, "hangs/<time>/": p.hangs, "goodput.json": p.goodput, "spikes.json": p.spikes,
        "logs/rank{R}.progress": p.rank_progress("{R}"), "previous/<time>/": p.previous, "checkpoints/step-NNNNNNN/": p.checkpoints,
        "slurm/job.sbatch": p.sbatch_script, "tensorboard/": p.tensorboard, "trackers.json": p.trackers,
        "wandb/": p.wandb, "mlflow.db": p.mlflow_db, "profile/": p.profile, "report/": p.report, "tmp/": p.tmp,
    }
    assert sorted(named) == sorted(documented_layout())
    for entry, path in named.items():
        relative = os.path.relpath(path, "RUN_DIR")
        assert entry.rstrip("/") == relative or entry.startswith(relative + "/"), (entry, path)
    assert store.step_dir("RUN_DIR", 7) == "RUN_DIR/checkpoints/step-0000007"
    assert p.rank_status(3) == "RUN_DIR/logs/rank3.status" and p.node_log("*") == "RUN_DIR/logs/node*.log"


def test_what_overwrite_moves_aside_is_documented_and_leaves_the_launch_files():
    top = {entry.split("/")[0] for entry in documented_layout()}
    assert set(paths.RUN_FILES) <= top
    assert not {paths.LOCK, paths.JOB_RECORD, paths.CHECKPOINTS, paths.PREVIOUS} & set(paths.RUN_FILES)


# ----------------------------------------------------------------------------------- status, place, job.json

def test_status_and_place_files_round_trip_with_their_exact_bytes(tmp_path):
    os.makedirs(RunPaths(str(tmp_path)).logs)
    ok = {"status": "ok", "error": None, "restart": 0, "host": "n1", "step": 20}
    err = {"status": "error", "error": "OSError: [Errno 28] No space left on device", "restart": 1, "host": "n2"}
    rank_files.write_status(str(tmp_path), 0, ok)
    rank_files.write_status(str(tmp_path), 10, err)
    rank_files.write_place(str(tmp_path), 10, {"rank": 10, "node": 1, "host": "n2", "local_rank": 2, "restart": 1})
    assert rank_files.read_statuses(str(tmp_path)) == {0: ok, 10: err}
    assert rank_files.read_places(str(tmp_path)) == {10: {"rank": 10, "node": 1, "host": "n2", "local_rank": 2,
                                                          "restart": 1}}
    assert (tmp_path / "logs" / "rank0.status").read_bytes() == json.dumps(ok).encode()
    assert sorted(os.listdir(tmp_path / "logs")) == ["rank0.status", "rank10.place", "rank10.status"]


def test_unreadable_or_foreign_rank_files_count_as_not_written(tmp_path):
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "rank1.status").write_text('{"status": "ok"')  # cut short
    (logs / "rankX.status").write_text("{}")
    (logs / ".rank2.status.abc.tmp").write_text('{"status": "ok"}')
    (logs / "rank3.status").write_text('{"status": "ok"}')
    assert rank_files.read_statuses(str(tmp_path)) == {3: {"status": "ok"}}
    assert rank_files.read_statuses(str(tmp_path / "absent")) == {}
    assert rank_files.status_written_at(str(tmp_path), 4) is None
    assert rank_files.status_written_at(str(tmp_path), 3) == os.path.getmtime(logs / "rank3.status")


def test_removing_statuses_keeps_logs_and_places(tmp_path):
    logs = tmp_path / "logs"
    logs.mkdir()
    for name in ("rank0.status", "rank1.status", "rank0.place", "rank0.log", "node0.log"):
        (logs / name).write_text("{}")
    rank_files.remove_statuses(str(tmp_path))
    assert sorted(os.listdir(logs)) == ["node0.log", "rank0.log", "rank0.place"]


def test_job_record_round_trips_and_tolerates_a_damaged_file(tmp_path):
    run_dir = str(tmp_path)
    assert job_record.read_launches(run_dir) == []
    launches = [{"launch": 1, "backend": "local", "exit_code": 0}, {"launch": 2, "backend": "slurm", "job_id": "7"}]
    job_record.write_launches(run_dir, launches)
    assert job_record.read_launches(run_dir) == launches
    assert (tmp_path / "job.json").read_bytes() == json.dumps({"launches": launches}, indent=1).encode()
    (tmp_path / "job.json").write_text('["not", "a", "record"]')
    assert job_record.read_launches(run_dir) == []
    (tmp_path / "job.json").write_text('{"launches": [1, {"launch": 1}]}')
    assert job_record.read_launches(run_dir) == [{"launch": 1}]


# ----------------------------------------------------------------------------------- nobody else does it by hand

# Where temp files may be renamed by hand: the contract itself, and the data package's own atomic writer.
RENAMERS = {"llmtrain/rundir/atomic.py", "llmtrain/data/atomic_files.py"}
# Names of the layout that only llmtrain.rundir may spell.
CONTRACT_NAMES = {"metrics.jsonl", "job.json", ".lock", "trackers.json", ".status", ".place", "logs", "mlflow.db",
                  "combined.log", "previous", "checkpoints"}


def _code_strings(tree: ast.AST) -> set[str]:
    """String constants of a module, docstrings left out."""
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, (ast.Module, ast.FunctionDef, ast.ClassDef, ast.AsyncFunctionDef))
                  and node.body and isinstance(node.body[0], ast.Expr)}
    return {node.value for node in ast.walk(tree) if isinstance(node, ast.Constant) and isinstance(node.value, str)
            and id(node) not in docstrings}


def test_no_module_outside_rundir_renames_temp_files_or_spells_the_layout():
    renames, spelled = [], []
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = path.relative_to(REPO).as_posix()
        tree = ast.parse(path.read_text())
        calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and ast.unparse(n.func) == "os.replace"]
        if calls and relative not in RENAMERS:
            renames.append(relative)
        if not relative.startswith("llmtrain/rundir/"):
            spelled += [f"{relative}: {s!r}" for s in sorted(_code_strings(tree) & CONTRACT_NAMES)]
    assert renames == []
    assert spelled == []


def test_the_guard_finds_a_hand_built_path():
    tree = ast.parse('"""Writes metrics.jsonl."""\nimport os\npath = os.path.join(d, "metrics.jsonl")\n')
    assert _code_strings(tree) & CONTRACT_NAMES == {"metrics.jsonl"}
