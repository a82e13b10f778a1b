"""Checkpoint folders on an object store and on a local folder, through the one storage interface: listing (complete,
partial), what resume takes, retention, clean-up of partial folders, verification, the commit of a save, the
launch-time probe's one-line answers, and the fast tier's background upload under throttling and cut uploads.

The store is a moto S3 server on loopback reached through the real client stack (s3fs, aiobotocore); faults come
from a proxy in front of it (helpers.s3_faults), never from mocks."""

from __future__ import annotations

import json
import os
import re
import zlib

import pytest
from helpers import s3_server
from helpers.s3_faults import unreachable_endpoint

from llmtrain.checkpoint import store
from llmtrain.checkpoint.location import Tiers
from llmtrain.checkpoint.resume import resolve_resume
from llmtrain.checkpoint.storage import storage_for
from llmtrain.checkpoint.storage.probe import why_unwritable
from llmtrain.checkpoint.upload import Uploader
from llmtrain.errors import CheckpointError

SHARD = b"x" * 100


def write_checkpoint(location: str, step: int, meta: bool = True, staged: bool = False) -> str:
    """A checkpoint folder as the trainer leaves it: DCP's index, one shard, config.yaml, and (meta) meta.json with
    each file's size and CRC32. `staged`: a filesystem's unfinished save (step-NNNNNNN.tmp)."""
    storage = storage_for(location)
    path = storage.join(location, f"step-{step:07d}" + (".tmp" if staged else ""))
    storage.makedirs(path)
    files = {".metadata": b"index", "__0_0.distcp": SHARD, "config.yaml": b"model: {}\n"}
    for name, data in files.items():
        storage.write_bytes(storage.join(path, name), data)
    if meta:
        manifest = {n: {"bytes": len(d), "crc32": zlib.crc32(d)} for n, d in sorted(files.items())}
        storage.write_bytes(storage.join(path, store.META), json.dumps({"step": step, "files": manifest}).encode())
    return path


def write_partial(location: str, step: int) -> str:
    """What a killed save leaves: on a filesystem a .tmp folder, on an object store a folder without meta.json."""
    return write_checkpoint(location, step, meta=False, staged=storage_for(location).renames)


def where(location: str) -> str:
    """What store.py is asked with: the run directory for a local location (RUN_DIR/checkpoints), the URI for a
    store (its own location)."""
    return location if "://" in location else os.path.dirname(location)


def names(location: str) -> list[str]:
    return sorted(storage_for(location).listdir(location))


@pytest.fixture(params=["local", "s3"])
def location(request, tmp_path):
    """Where a run's checkpoints are kept: a local folder, or a prefix of a fresh bucket on the test S3 server."""
    if request.param == "local":
        return str(tmp_path / "run" / "checkpoints")
    s3 = request.getfixturevalue("s3")
    s3_server.fresh_clients()
    return f"s3://{s3.bucket('storage')}/runs/r1"


# ---- store.py through either storage ------------------------------------------------------------------------------


def test_listing_tells_complete_from_partial_and_resume_takes_the_newest_complete(location):
    for step in (2, 4):
        write_checkpoint(location, step)
    partial = write_partial(location, 6)
    infos = store.list_checkpoints(where(location))
    assert [(i.step, i.complete, i.partial, i.corrupt, i.tier) for i in infos] == [
        (2, True, False, False, "store"), (4, True, False, False, "store"), (6, False, True, False, "store")]
    assert infos[1].meta["step"] == 4 and infos[1].size_bytes == 5 + 100 + 10 + len(
        storage_for(location).read_bytes(storage_for(location).join(infos[1].path, store.META)))
    latest, ignored = store.latest_complete(where(location))
    assert latest.path == storage_for(location).join(location, "step-0000004")
    assert [i.path for i in ignored] == [partial]
    resolution = resolve_resume(where(location), "auto")
    assert resolution.checkpoint == latest.path and resolution.why == "auto: newest complete checkpoint step-0000004"


def test_prune_keeps_the_newest_and_removes_older_partial_folders(location):
    for step in (2, 4, 6, 8):
        write_checkpoint(location, step)
    older_partial = write_partial(location, 5)
    newer_partial = write_partial(location, 9)  # a save that may still be in flight: kept
    newest = storage_for(location).join(location, "step-0000008")
    removed = store.prune(where(location), keep=2, protect=newest)
    assert sorted(removed) == sorted([storage_for(location).join(location, "step-0000002"),
                                      storage_for(location).join(location, "step-0000004"), older_partial])
    assert storage_for(location).basename(newer_partial) in names(location)
    assert [i.step for i in store.list_checkpoints(where(location)) if i.complete] == [6, 8]
    # Nothing of a removed folder is left behind under its prefix.
    assert not list(storage_for(location).walk_files(storage_for(location).join(location, "step-0000002")))


def test_remove_partials_leaves_complete_checkpoints(location):
    write_checkpoint(location, 4)
    partials = [write_partial(location, 2), write_partial(location, 9)]
    assert sorted(store.remove_partials(where(location))) == sorted(partials)
    assert names(location) == ["step-0000004"]
    assert store.remove_partials(where(location)) == []


def test_verify_names_a_size_and_a_crc_mismatch(location):
    path = write_checkpoint(location, 4)
    storage = storage_for(location)
    shard = storage.join(path, "__0_0.distcp")
    assert store.verify(path)["step"] == 4
    storage.write_bytes(shard, b"x" * 90)
    with pytest.raises(CheckpointError) as e:
        store.verify(path)
    assert (e.value.key, e.value.message) == (shard, "checkpoint file is truncated or altered: 90 bytes, 100 written")
    storage.write_bytes(shard, b"y" * 100)
    assert store.verify(path, crc=False)["step"] == 4  # sizes only: what a worker checks
    with pytest.raises(CheckpointError) as e:
        store.verify(path)
    corrupted = "checkpoint file is corrupted (CRC32 differs from the one written)"
    assert (e.value.key, e.value.message) == (shard, corrupted)
    storage.remove(storage.join(path, store.META))
    with pytest.raises(CheckpointError, match=r"missing or unreadable meta\.json: not a complete checkpoint"):
        store.verify(path)


def test_finalize_commits_only_what_every_rank_wrote(location):
    """The counted manifest must agree with what the store holds before meta.json commits the folder."""
    path = write_checkpoint(location, 4, meta=False, staged=storage_for(location).renames)
    storage = storage_for(location)
    counted = {".metadata": {"bytes": 5, "crc32": zlib.crc32(b"index")},
               "__0_0.distcp": {"bytes": 100, "crc32": zlib.crc32(SHARD)}}
    for wrong, held in (({"bytes": 120, "crc32": 0}, "100"), (None, "no such file")):
        written = dict(counted, **{"__0_0.distcp" if wrong else "__1_0.distcp": wrong or {"bytes": 7, "crc32": 0}})
        name = "__0_0.distcp" if wrong else "__1_0.distcp"
        with pytest.raises(CheckpointError) as e:
            store.finalize(path, {"step": 4}, written)
        expect = f"written with {written[name]['bytes']} bytes, but the store holds {held}"
        assert (e.value.key, e.value.message) == (storage.join(path, name), expect)
        assert not storage.isfile(storage.join(path, store.META))  # not committed
    final = store.finalize(path, {"step": 4}, counted)
    assert final == storage.join(location, "step-0000004")
    files = store.read_meta(final)["files"]
    assert files == {**counted, "config.yaml": {"bytes": 10, "crc32": zlib.crc32(b"model: {}\n")}}
    assert store.verify(final)["step"] == 4


def test_the_fast_tier_is_listed_beside_the_store_and_its_newest_checkpoint_taken(location, tmp_path):
    fast = str(tmp_path / "fast")
    write_checkpoint(location, 4)
    write_checkpoint(fast, 4)
    write_checkpoint(fast, 6)
    tiers = Tiers(location, fast)
    infos = store.list_checkpoints(tiers)
    assert [(i.step, i.tier) for i in infos] == [(4, "store"), (4, "local"), (6, "local")]
    resolution = resolve_resume(tiers, "auto")
    assert resolution.checkpoint == os.path.join(fast, "step-0000006")
    assert resolution.why == "auto: newest complete checkpoint step-0000006 (the fast tier, checkpoint.local_dir)"


def test_a_dcp_save_counts_every_byte_it_writes_and_reads_back(location):
    """torch.distributed.checkpoint through the storage's writer and reader, in one process: on a store the writer's
    count (sizes and CRC32s as the bytes went out) is what the store holds, and the state reads back bit for bit."""
    import warnings

    import torch
    import torch.distributed.checkpoint as dcp

    storage = storage_for(location)
    path = storage.staged_name(storage.join(location, "step-0000004"))
    storage.makedirs(path)
    state = {"w": torch.arange(5000, dtype=torch.float32).reshape(50, 100), "step": torch.tensor(4)}
    writer = storage.dcp_writer(path)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "assuming the intent is to save in a single process"
        dcp.save(state, storage_writer=writer, no_dist=True)
        loaded = {"w": torch.zeros(50, 100), "step": torch.tensor(0)}
        dcp.load(loaded, storage_reader=storage.dcp_reader(path), no_dist=True)
    assert torch.equal(loaded["w"], state["w"]) and loaded["step"].item() == 4
    if storage.renames:
        return  # a filesystem's writer is torch's own: its manifest is read back (store.file_manifest)
    held = storage.sizes(path)
    assert set(writer.written) == set(held) and ".metadata" in held
    for name, counted in writer.written.items():
        data = storage.read_bytes(storage.join(path, name))
        assert counted == {"bytes": len(data), "crc32": zlib.crc32(data)} == {"bytes": held[name],
                                                                             "crc32": zlib.crc32(data)}, name


# ---- the probe before a launch ---------------------------------------------------------------------------------


def test_the_probe_writes_reads_and_removes_one_object(s3_faulty, s3_server):
    bucket = s3_server.bucket("probe")
    assert why_unwritable(f"s3://{bucket}/runs/r1") is None
    assert not s3_server.filesystem().find(bucket)  # the probe object is gone again
    methods = [r.method for r in s3_faulty.requests()]
    assert methods[0] == "PUT" and "GET" in methods and methods[-1] == "DELETE", methods


def test_the_probe_names_an_unreachable_endpoint(s3, monkeypatch):
    endpoint = unreachable_endpoint()
    monkeypatch.setenv("AWS_ENDPOINT_URL", endpoint)
    problem = why_unwritable("s3://ckpts/runs/r1")
    assert re.fullmatch(rf"s3://ckpts/runs/r1: the store's endpoint cannot be reached \(AWS_ENDPOINT_URL="
                        rf"{endpoint}\): Could not connect to the endpoint URL: \"{endpoint}/ckpts/runs/r1/"
                        r"\.llmtrain-probe-[^\"]+\"", problem), problem


def test_the_probe_names_a_missing_bucket(s3):
    assert why_unwritable("s3://no-such-bucket-storage/runs/r1") == (
        "s3://no-such-bucket-storage/runs/r1: no such bucket: The specified bucket does not exist")


def test_the_probe_names_a_denied_write(s3_faulty, s3_server):
    bucket = s3_server.bucket("probe")
    s3_faulty.deny()
    assert why_unwritable(f"s3://{bucket}/r1") == (
        f"s3://{bucket}/r1: access denied (check the credentials and the bucket's policy): Access Denied")
    assert [(r.method, r.status) for r in s3_faulty.requests()] == [("PUT", 403)]  # no retry of a refusal


def test_the_probe_names_throttling_that_outlasts_the_retries(s3_faulty, s3_server):
    bucket = s3_server.bucket("probe")
    s3_faulty.throttle(1000)
    problem = why_unwritable(f"s3://{bucket}/r1")
    assert len(s3_faulty.requests(status=503)) >= 5  # the client did retry, every time throttled
    assert problem == (f"s3://{bucket}/r1: the store throttles requests (retry later): "
                       "[Errno 16] Please reduce your request rate.")


# ---- the fast tier's background upload --------------------------------------------------------------------------


def upload(local: str, target: str, step: int) -> list[str]:
    """One checkpoint uploaded by the fast tier's thread, to the end of the run; the lines it logged."""
    lines: list[str] = []
    uploader = Uploader(target, keep=2, log=lambda line, **_: lines.append(line))
    uploader.submit(local, step)
    uploader.finish()
    return lines


def uploaded_in_order(proxy, target_key: str) -> list[str]:
    """The files of the upload that the store took (a 200 to their PUT), in the order it took them."""
    return [r.key.rsplit("/", 1)[-1] for r in proxy.requests("PUT", 200) if r.key.startswith(target_key)]


@pytest.fixture
def fast_checkpoint(tmp_path):
    """A local checkpoint at step 4 with a 256 KiB shard (a cut PUT has a body to cut)."""
    path = write_checkpoint(str(tmp_path / "fast"), 4)
    with open(os.path.join(path, "__0_0.distcp"), "wb") as f:
        f.write(os.urandom(1 << 18))
    meta = json.loads(open(os.path.join(path, store.META)).read())
    meta["files"] = store.file_manifest(path)
    with open(os.path.join(path, store.META), "w") as f:
        json.dump(meta, f)
    return path


def check_committed(target: str, local: str) -> None:
    """The store's copy is the local one, file for file, and verifies; the local copy stays."""
    remote = f"{target}/step-0000004"
    local_files = dict(storage_for(local).walk_files(local))
    assert dict(storage_for(remote).walk_files(remote)) == local_files
    assert store.verify(remote)["step"] == 4 and store.verify(local)["step"] == 4
    assert [(i.step, i.complete) for i in store.list_checkpoints(target)] == [(4, True)]


def retry_warning(line: str, target: str, local: str, wait_s: int) -> str:
    """The failure an Uploader's warning line gives, after checking the rest of the line word for word."""
    head = f"llmtrain: warning: upload of checkpoint step 4 to {target} failed ("
    tail = f"); retrying in {wait_s} s; the local copy stays at {local}"
    assert line.startswith(head) and line.endswith(tail), line
    return line[len(head):-len(tail)]


def test_a_throttled_upload_is_retried_and_committed_last(s3_faulty, s3_server, fast_checkpoint):
    target = f"s3://{s3_server.bucket('upload')}/runs/r1"
    # The client's five tries of the shard's PUT, all answered SlowDown. (A HEAD has no body to say SlowDown in: a
    # 503 to it is not retried by the client, so each of the uploader's tries would meet one.)
    s3_faulty.throttle(5, only="/step-0000004/__0_0.distcp")
    lines = upload(fast_checkpoint, target, 4)
    assert len(lines) == 2, lines
    reason = retry_warning(lines[0], target, fast_checkpoint, 1)
    assert reason.startswith(f"{target}/step-0000004/__0_0.distcp: ") and reason.endswith(
        "[Errno 16] Please reduce your request rate."), reason  # the file, then the store's words
    assert re.fullmatch(rf"llmtrain: uploaded checkpoint step 4 -> {target}/step-0000004 \(0\.3 MiB, [\d.]+ s\)",
                        lines[1]), lines
    assert len(s3_faulty.requests(status=503)) == 5
    # The first try got as far as DCP's index; meta.json, the commit, went up once and last, after every file.
    assert uploaded_in_order(s3_faulty, target[len("s3:/"):]) == [".metadata", ".metadata", "__0_0.distcp",
                                                                  "config.yaml", store.META]
    check_committed(target, fast_checkpoint)


def test_a_cut_upload_is_retried_and_committed_last(s3_faulty, s3_server, fast_checkpoint):
    target = f"s3://{s3_server.bucket('upload')}/runs/r1"
    key = target[len("s3:/"):]
    # The shard's PUT, cut half-way on each of the client's tries (s3fs's five, each retried once by botocore); the
    # body's rest drained, so that the client always sees a closed connection (and retries it), never a reset.
    s3_faulty.cut_put(2, times=10, drain=True)
    lines = upload(fast_checkpoint, target, 4)
    assert len(lines) == 2, lines
    reason = retry_warning(lines[0], target, fast_checkpoint, 1)
    assert reason == (f"{target}/step-0000004/__0_0.distcp: the store's endpoint cannot be reached "
                      f"(AWS_ENDPOINT_URL={s3_faulty.endpoint}): Connection was closed before we received a valid "
                      f'response from endpoint URL: "{s3_faulty.endpoint}{key}/step-0000004/__0_0.distcp".'), reason
    assert lines[1].startswith(f"llmtrain: uploaded checkpoint step 4 -> {target}/step-0000004 ")
    cuts = s3_faulty.requests(status="cut")
    assert [r.key for r in cuts] == [f"{key}/step-0000004/__0_0.distcp"] * 10
    # Until the retry, the store held the first file and no meta.json: an incomplete folder.
    log = s3_faulty.requests()
    last_cut = max(i for i, r in enumerate(log) if r.status == "cut")
    assert [r.key.rsplit("/", 1)[-1] for r in log[:last_cut] if r.method == "PUT" and r.status == 200] == [
        ".metadata"]
    # The retry wrote every file again, meta.json last.
    assert [r.key.rsplit("/", 1)[-1] for r in log[last_cut:] if r.method == "PUT" and r.status == 200] == [
        ".metadata", "__0_0.distcp", "config.yaml", store.META]
    check_committed(target, fast_checkpoint)


def test_one_put_cut_mid_body_is_retried_by_the_client_and_lands_whole(s3_faulty, s3_server):
    """A single cut (half the body read, then the connection closed) never reaches the caller: the client sends the
    object again, whole."""
    uri = f"s3://{s3_server.bucket('cut')}/runs/r1/step-0000004/__0_0.distcp"
    data = os.urandom(1 << 18)
    s3_faulty.cut_put(1)
    storage_for(uri).write_bytes(uri, data)
    assert [(r.method, r.status) for r in s3_faulty.requests("PUT")] == [("PUT", "cut"), ("PUT", 200)]
    assert s3_server.filesystem().cat_file(uri[len("s3://"):]) == data
