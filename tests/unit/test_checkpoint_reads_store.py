"""Every command that reads a checkpoint, given an object-store URI instead of a folder: `ckpt list` (and its tier
column beside a fast tier), `ckpt verify`, `ckpt diff`, `ckpt export` (also to a URI, uploaded with the file that
marks it complete last), `model.init_from` (a checkpoint folder or a Hugging Face folder at a URI), `generate`; and
what a launch forwards to workers that use a store.

The checkpoints are a tiny GPT's (steps 2 and 4, trained in this process), uploaded as they are to a moto S3 server
on loopback, reached through the real client stack (s3fs)."""

from __future__ import annotations

import json
import os
import re
import shutil
import zlib
from pathlib import Path

import pytest
import torch
from helpers import s3_server as s3_server_module
from helpers.ckpt_runs import TINY, cli, full_state, run, train  # noqa: F401  (run: the fixture)
from omegaconf import OmegaConf
from torch.distributed.checkpoint import FileSystemReader

from llmtrain.checkpoint.export import (export_checkpoint, load_model_state, read_safetensors,
                                        read_safetensors_metadata)
from llmtrain.checkpoint.pretrained import inspect_pretrained
from llmtrain.checkpoint.storage import storage_for
from llmtrain.checkpoint.storage.object_store import ObjectStorage
from llmtrain.cli import main
from llmtrain.config import ConfigError, compose_config, load_run_config
from llmtrain.launch.backends.base import worker_env
from llmtrain.launch.config_probes import validate_here

STEP4 = "step-0000004"


def upload(s3, local: Path, key: str) -> None:
    """Every file under `local`, to bucket/prefix `key`, as it is."""
    fs = s3.filesystem()
    for path in sorted(p for p in local.rglob("*") if p.is_file()):
        fs.put_file(str(path), f"{key}/{path.relative_to(local).as_posix()}")


def stored_run(run, server) -> str:
    """The run's checkpoint location on the store: s3://BUCKET/runs/r1 holding step-0000002 and step-0000004."""
    location = f"s3://{server.bucket('reads')}/runs/r1"
    upload(server, run / "checkpoints", location[len("s3://"):])
    return location


@pytest.fixture(scope="module")
def store_env(s3_server):
    """This process's environment pointed at the test server, for the module (uploads are shared by its tests)."""
    with pytest.MonkeyPatch.context() as patch:
        for key, value in s3_server.env.items():
            patch.setenv(key, value)
        s3_server_module.fresh_clients()  # a client made before would not know the endpoint
        yield s3_server
    s3_server_module.fresh_clients()


@pytest.fixture(scope="module")
def shared(run, store_env) -> str:
    """stored_run, uploaded once for the tests that only read it and write beside it."""
    return stored_run(run, store_env)


@pytest.fixture
def remote(shared) -> str:
    return shared


@pytest.fixture
def own_remote(run, s3) -> str:
    """stored_run for a test that changes what is stored."""
    s3_server_module.fresh_clients()
    return stored_run(run, s3)


def table_rows(out: str) -> list[list[str]]:
    """The cells of each row of a printed table, the header row first."""
    lines = [line for line in out.splitlines() if line.startswith(("│", "┃"))]
    return [[c.strip() for c in line.strip("│┃ ").split("│" if "│" in line else "┃")] for line in lines]


# ---- ckpt list ---------------------------------------------------------------------------------------------------


def test_list_takes_a_location_uri_and_names_an_unfinished_upload(own_remote, capsys):
    remote = own_remote
    storage_for(remote).write_bytes(f"{remote}/step-0000006/.metadata", b"cut off")  # no meta.json: not committed
    code, out, err = cli(capsys, "list", remote)
    assert code == 0 and err == ""
    rows = table_rows(out)
    assert rows[0] == ["step", "state", "size", "layout", "path"]
    assert [(r[0], r[1], r[4]) for r in rows[1:]] == [
        ("2", "complete", f"{remote}/step-0000002"), ("4", "complete", f"{remote}/{STEP4}"),
        ("6", "incomplete (no meta.json: save or upload did not finish)", f"{remote}/step-0000006")]
    assert rows[2][3] == "dp=1 tp=1 pp=1 zero=0 world_size=1"


def test_list_of_a_run_with_a_fast_tier_has_a_tier_column(remote, run, tmp_path, capsys):
    run_dir, fast = tmp_path / "run", tmp_path / "fast"
    run_dir.mkdir()
    (run_dir / "config.yaml").write_text(OmegaConf.to_yaml({"checkpoint": {"dir": remote, "local_dir": str(fast)}}))
    shutil.copytree(run / "checkpoints" / STEP4, fast / STEP4)
    code, out, _ = cli(capsys, "list", str(run_dir))
    rows = table_rows(out)
    assert code == 0 and rows[0] == ["step", "tier", "state", "size", "layout", "path"]
    assert [r[:3] + r[-1:] for r in rows[1:]] == [["2", "store", "complete", f"{remote}/step-0000002"],
                                                  ["4", "store", "complete", f"{remote}/{STEP4}"],
                                                  ["4", "local", "complete", str(fast / STEP4)]]


# ---- ckpt verify and diff ----------------------------------------------------------------------------------------


def _timeless(out: str) -> str:
    return re.sub(r"; \d+\.\d\d s$", "", out.strip(), flags=re.M)


def test_verify_of_a_location_uri_says_what_the_local_run_says(remote, run, capsys):
    local = cli(capsys, "verify", str(run))
    code, out, err = cli(capsys, "verify", remote)  # its newest checkpoint, as for a run directory
    assert code == 0 and err == "" and local[0] == 0
    assert _timeless(out) == _timeless(local[1]) and out.startswith(f"{STEP4}: ok: 3 files, ")


def test_verify_names_a_flipped_byte_in_a_stored_shard(own_remote, run, capsys):
    remote = own_remote
    shard = f"{remote}/{STEP4}/__0_0.distcp"
    data = bytearray((run / "checkpoints" / STEP4 / "__0_0.distcp").read_bytes())
    written = zlib.crc32(data)
    data[len(data) // 2] ^= 0xFF
    storage_for(shard).write_bytes(shard, bytes(data))
    code, out, err = cli(capsys, "verify", f"{remote}/{STEP4}")
    assert code == 1 and out == ""
    assert err == (f"llmtrain: verify failed: {STEP4}/__0_0.distcp: crc32 {zlib.crc32(data):08x} != manifest "
                   f"{written:08x}\n")


def _damage(ckpt: Path, key: str, how: str) -> None:
    """NaNs over the first values of `key`, or its serialized record's first byte flipped, where they lie in the
    shard; then meta.json records the files as they are (only reading the values finds it)."""
    (shard,) = ckpt.glob("*.distcp")
    data = bytearray(shard.read_bytes())
    if how == "nan":
        raw = full_state(ckpt)[key].numpy().tobytes()
        at = bytes(data).index(raw)  # torch.save stores a tensor's bytes uncompressed
        data[at:at + 4 * 12] = torch.full((12,), float("nan")).numpy().tobytes()
    else:
        md = FileSystemReader(str(ckpt)).read_metadata()
        (info,) = [i for index, i in md.storage_data.items() if index.fqn == key]
        data[info.offset] ^= 0xFF
    shard.write_bytes(bytes(data))
    meta = json.loads((ckpt / "meta.json").read_text())
    meta["files"] = {p.name: {"bytes": p.stat().st_size, "crc32": zlib.crc32(p.read_bytes())}
                     for p in ckpt.iterdir() if p.name != "meta.json"}
    (ckpt / "meta.json").write_text(json.dumps(meta))


@pytest.mark.parametrize("how", ["nan", "unreadable"])
def test_verify_reads_a_stored_checkpoint_s_values_in_groups_and_names_the_same_tensor(own_remote, run, s3, tmp_path,
                                                                                      capsys, how):
    """From a store tensors are read many per load; the first bad one is named as the local one-by-one read names
    it, also when a group's load fails."""
    ckpt = Path(shutil.copytree(run / "checkpoints" / STEP4, tmp_path / STEP4))
    _damage(ckpt, "model.layers.1.mlp.fc.weight", how)
    local = cli(capsys, "verify", str(ckpt))
    upload(s3, ckpt, f"{own_remote[len('s3://'):]}/{STEP4}")
    there = cli(capsys, "verify", f"{own_remote}/{STEP4}")
    assert local[0] == there[0] == 1 and local[1] == there[1] == ""
    assert there[2] == local[2]
    assert there[2].startswith("llmtrain: verify failed: " + (
        "model.layers.1.mlp.fc.weight: 12 non-finite values (of 4096)" if how == "nan" else
        f"{STEP4}/__0_0.distcp: cannot read model.layers.1.mlp.fc.weight ("))


def test_verify_and_diff_of_a_missing_uri_are_one_line_exit_2(remote, capsys):
    missing = remote.rsplit("/", 1)[0] + "/nothing"
    assert cli(capsys, "verify", missing) == (
        2, "", f"llmtrain: error: {missing}: no such checkpoint folder or run directory\n")
    assert cli(capsys, "diff", missing, remote) == (
        2, "", f"llmtrain: error: {missing}: no such checkpoint folder or run directory\n")


def test_diff_compares_a_stored_checkpoint_with_a_local_one(remote, run, capsys):
    compared = len(full_state(run / "checkpoints" / STEP4))
    code, out, _ = cli(capsys, "diff", remote, str(run / "checkpoints" / STEP4))
    assert code == 0
    assert out.splitlines()[0] == f"A: {remote}/{STEP4} (step 4)"
    assert out.splitlines()[-1] == (f"identical: {compared} tensors compared, 0 differ, 0 only in A, 0 only in B "
                                    "(atol 0)")
    code, out, _ = cli(capsys, "diff", "--model-only", f"{remote}/step-0000002", str(run))
    assert code == 1 and out.splitlines()[-1].startswith("different: ")


# ---- ckpt export -------------------------------------------------------------------------------------------------


def _recorded_uploads(monkeypatch, fail_on: str | None = None) -> dict[str, bytes]:
    """{name: the local file's bytes} of what put_file uploads, in order; `fail_on`: that name's upload fails as a
    dropped connection would."""
    sent: dict[str, bytes] = {}
    put = ObjectStorage.put_file

    def recording(self, local_path, path):
        sent[os.path.basename(path)] = Path(local_path).read_bytes()
        if os.path.basename(path) == fail_on:
            raise ConnectionError("connection reset by peer")
        put(self, local_path, path)

    monkeypatch.setattr(ObjectStorage, "put_file", recording)
    return sent


@pytest.mark.parametrize("fmt, last", [("hf", "config.json"), ("safetensors", "model.safetensors")])
def test_export_to_a_uri_uploads_the_same_bytes_the_file_that_completes_it_last(remote, tmp_path, capsys,
                                                                               monkeypatch, fmt, last):
    out = remote.rsplit("/", 2)[0] + f"/exports/{fmt}"
    sent = _recorded_uploads(monkeypatch)
    code, printed, err = cli(capsys, "export", remote, "--format", fmt, "--out", out)
    assert code == 0, err
    assert printed.splitlines()[0] == f"exporting {remote}/{STEP4} (newest complete checkpoint of {remote})"
    assert list(sent)[-1] == last and len(sent) == 2
    storage = storage_for(out)
    assert {name: storage.read_bytes(f"{out}/{name}") for name in storage.listdir(out)} == sent
    # What was sent is the export a local folder gets from the same checkpoint: the same text files, the same
    # tensors and header metadata (safetensors writes its metadata in no fixed order: bytes may differ there).
    here = tmp_path / "here"
    export_checkpoint(f"{remote}/{STEP4}", fmt, here)
    assert sorted(sent) == sorted(p.name for p in here.iterdir())
    (tmp_path / "sent.safetensors").write_bytes(sent["model.safetensors"])
    ours, theirs = read_safetensors(tmp_path / "sent.safetensors"), read_safetensors(here / "model.safetensors")
    assert sorted(ours) == sorted(theirs) and all(torch.equal(ours[n], theirs[n]) for n in ours)
    assert read_safetensors_metadata(tmp_path / "sent.safetensors") == read_safetensors_metadata(
        here / "model.safetensors")
    text = next(name for name in sent if name != "model.safetensors")
    assert sent[text] == (here / text).read_bytes()


def test_a_failed_upload_leaves_no_export_behind(remote, capsys, monkeypatch):
    out = remote.rsplit("/", 2)[0] + "/exports/cut"
    sent = _recorded_uploads(monkeypatch, fail_on="config.json")
    with pytest.raises(ConnectionError):
        export_checkpoint(f"{remote}/{STEP4}", "hf", out)
    assert list(sent) == ["model.safetensors", "config.json"]
    assert storage_for(out).listdir(out) == {}


def test_export_to_a_uri_that_holds_files_is_refused(remote, capsys):
    code, out, err = cli(capsys, "export", remote, "--format", "hf", "--out", remote)
    assert code == 2
    assert err == (f"llmtrain: error: --out: {remote} exists and is not empty; choose a new or empty folder\n")


# ---- model.init_from ---------------------------------------------------------------------------------------------


def test_init_from_a_checkpoint_at_a_uri_reads_its_model_tensors(remote, run):
    ckpt = run / "checkpoints" / STEP4
    cfg = load_run_config(str(ckpt / "config.yaml"))
    expected, _ = load_model_state(ckpt)
    for where in (f"{remote}/{STEP4}", str(ckpt)):
        src = inspect_pretrained(where, cfg.model)
        count = sum(t.numel() for t in expected.values())
        assert src.describe() == (f"model.init_from: loaded {len(expected)} tensors ({count:,} parameters) from "
                                  f"{where} (llmtrain checkpoint)")
        loaded = src.load()
        assert sorted(loaded) == sorted(expected)
        assert all(torch.equal(loaded[n], expected[n]) for n in expected)
        assert torch.equal(src["embed.tok.weight"], expected["embed.tok.weight"])


def test_init_from_a_hugging_face_folder_at_a_uri_reads_what_the_local_one_holds(remote, run, s3, tmp_path):
    ckpt = run / "checkpoints" / STEP4
    cfg = load_run_config(str(ckpt / "config.yaml"))
    export_checkpoint(ckpt, "hf", tmp_path / "hf")
    uri = remote.rsplit("/", 2)[0] + "/hf/gpt"
    upload(s3, tmp_path / "hf", uri[len("s3://"):])
    local, there = inspect_pretrained(tmp_path / "hf", cfg.model), inspect_pretrained(uri, cfg.model)
    assert there.format_name == "HF GPT-2" and there.files == [f"{uri}/model.safetensors"]
    mine, theirs = local.load(), there.load()
    assert sorted(theirs) == sorted(mine) and all(torch.equal(theirs[n], mine[n]) for n in mine)
    # A bare torch file with llmtrain names, at a URI: read whole (it cannot be memory-mapped from a store).
    torch.save(mine, tmp_path / "weights.pt")
    s3.filesystem().put_file(str(tmp_path / "weights.pt"), f"{uri[len('s3://'):]}.pt")
    bare = inspect_pretrained(f"{uri}.pt", cfg.model).load()
    assert sorted(bare) == sorted(mine) and all(torch.equal(bare[n], mine[n]) for n in mine)


def test_init_from_a_missing_uri_is_one_line(remote, run):
    cfg = load_run_config(str(run / "checkpoints" / STEP4 / "config.yaml"))
    with pytest.raises(ConfigError) as err:
        inspect_pretrained(f"{remote}/nothing", cfg.model)
    assert str(err.value) == f"model.init_from: no such file or folder: {remote}/nothing"


def test_init_from_a_checkpoint_of_another_family_is_refused_by_its_config(run):
    llama = compose_config(["model=llama-tiny", "cluster.nproc_per_node=1"])
    ckpt = run / "checkpoints" / STEP4
    with pytest.raises(ConfigError) as err:
        inspect_pretrained(ckpt, llama.model)
    assert str(err.value) == (f"model.init_from: {ckpt} is a checkpoint of model.arch=gpt2 but model.arch=llama; "
                              "set model.arch=gpt2 (and its sizes)")


def test_a_run_starts_from_a_checkpoint_at_a_uri(remote, run, tmp_path, capsys):
    """validate_here takes the URI without looking for a local file; rank 0 logs what it loaded."""
    run_dir = tmp_path / "fresh"
    run_dir.mkdir()
    train(run_dir, overrides=(f"model.init_from={remote}/{STEP4}", "train.max_steps=1", "checkpoint.interval=0"))
    expected, _ = load_model_state(run / "checkpoints" / STEP4)
    count = sum(t.numel() for t in expected.values())
    assert (f"llmtrain: model.init_from: loaded {len(expected)} tensors ({count:,} parameters) from {remote}/{STEP4} "
            "(llmtrain checkpoint)") in capsys.readouterr().out


# ---- generate ----------------------------------------------------------------------------------------------------


def test_generate_from_a_location_uri_gives_the_local_checkpoint_s_ids(remote, run, capsys):
    args = ["--prompt", "def ", "--tokenizer", "byte", "--temperature", "0", "--max-new-tokens", "8", "--json",
            "--device", "cpu"]
    assert main(["generate", str(run), *args]) == 0
    local = json.loads(capsys.readouterr().out)
    assert main(["generate", remote, *args]) == 0
    captured = capsys.readouterr()
    there = json.loads(captured.out)
    assert there["checkpoint"] == f"{remote}/{STEP4}" and there["step"] == 4
    assert there["ids"] == local["ids"] and len(there["ids"]) == 8
    assert captured.err.startswith(f"llmtrain: generating from {remote}/{STEP4} (newest complete checkpoint of "
                                   f"{remote}), step 4, on cpu")


# ---- what workers get ----------------------------------------------------------------------------------------------


STORE_VARIABLES = {"AWS_ENDPOINT_URL": "http://store.example:9000", "AWS_PROFILE": "training",
                   "AWS_REGION": "eu-west-1", "AWS_CA_BUNDLE": "/etc/ssl/store.pem"}
SECRETS = {"AWS_ACCESS_KEY_ID": "AKIDEXAMPLE", "AWS_SECRET_ACCESS_KEY": "secret", "AWS_SESSION_TOKEN": "token"}


@pytest.mark.parametrize("override, forwarded", [("checkpoint.dir=s3://b/runs/r1", True),
                                                 ("model.init_from=s3://b/hf/gpt", True),
                                                 ("checkpoint.dir=/shared/ckpt", False)])
def test_workers_get_the_store_s_endpoint_and_profile_never_its_keys(monkeypatch, tmp_path, override, forwarded):
    for name in ("AWS_ENDPOINT_URL_S3", "AWS_DEFAULT_REGION", "AWS_CONFIG_FILE", "AWS_SHARED_CREDENTIALS_FILE"):
        monkeypatch.delenv(name, raising=False)
    for name, value in {**STORE_VARIABLES, **SECRETS}.items():
        monkeypatch.setenv(name, value)
    cfg = compose_config([*TINY, f"run.dir={tmp_path}", override])
    env = worker_env(cfg)
    assert {k: v for k, v in env.items() if k.startswith("AWS_")} == (STORE_VARIABLES if forwarded else {})


def test_validation_takes_an_init_from_uri_without_a_local_file(tmp_path):
    base = [*TINY, f"run.dir={tmp_path}", "cluster.nproc_per_node=1"]
    validate_here(compose_config([*base, "model.init_from=s3://no-bucket/hf/gpt"]))
    with pytest.raises(ConfigError) as err:
        validate_here(compose_config([*base, f"model.init_from={tmp_path}/nothing"]))
    assert str(err.value) == f"model.init_from: no such file or folder: {tmp_path}/nothing"

