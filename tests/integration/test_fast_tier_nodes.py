"""The fast tier on each node's own disk (checkpoint.local_dir not shared): two ranks run as two nodes, each with a
private disk mounted at the same path (tests/helpers/node_disks.py), and checkpoint.dir on an S3 server
(tests/helpers/s3_server.py). Each node keeps and uploads its own shards, node 0 commits the store's copy once
both nodes' parts are there, the store's copy is whole and resumes with the losses of an uninterrupted run."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from conftest import SMALL, train_losses
from helpers import node_disks
from helpers.inprocess_run import prepare_launch, train_in_process
from helpers.ranks import run_ranks

from llmtrain.checkpoint import store

pytestmark = pytest.mark.slow
ARGS = [*SMALL, "train.max_steps=10", "checkpoint.interval=2", "checkpoint.keep=2", "checkpoint.upload_every=2"]


@pytest.fixture(scope="module")
def node_local_run(s3_server, tmp_path_factory):
    why = node_disks.unavailable()
    if why:
        pytest.skip(why)
    tmp = tmp_path_factory.mktemp("nodes")
    with pytest.MonkeyPatch.context() as mp:
        for key, value in s3_server.env.items():
            mp.setenv(key, value)
        bucket = s3_server.bucket("nodes")
        run_dir, local_dir, disks = tmp / "run", tmp / "local", tmp / "disks"
        location = f"s3://{bucket}/run"
        # Stopped at step 5 of 10: its last save (the 3rd) is not due for upload, yet goes up as the run ends.
        prepare_launch(run_dir, *ARGS, "train.stop_at_step=5", f"checkpoint.dir={location}",
                       f"checkpoint.local_dir={local_dir}")
        codes = run_ranks(2, node_disks.worker_on_own_node, str(run_dir), str(local_dir), str(disks),
                          init_group=False, timeout=300)
        assert codes == [0, 0], (run_dir / "logs" / "rank0.log").read_text()[-3000:]
        first_log = (run_dir / "logs" / "rank0.log").read_text()
        stored = [i for i in store.list_checkpoints(location) if i.complete]
        metas = {i.step: store.verify(i.path, crc=True) for i in stored}  # sizes and CRC32s as written on nodes
        leftovers = {i.step: set(store.storage_for(i.path).sizes(i.path)) - set(metas[i.step]["files"])
                     for i in stored}
        # Resumed on one node, without the fast tier: from the store's copy.
        train_in_process(run_dir, *ARGS, f"checkpoint.dir={location}")
        yield {"run_dir": run_dir, "local_dir": local_dir, "disks": disks, "location": location,
               "stored": stored, "metas": metas, "leftovers": leftovers, "first_log": first_log,
               "log": (run_dir / "logs" / "rank0.log").read_text()}


def names(folder: Path) -> set[str]:
    return {p.name for p in folder.iterdir()}


def test_each_node_keeps_only_its_own_shards_sealed_with_one_manifest(node_local_run):
    node0, node1 = (node_local_run["disks"] / f"node{n}" for n in (0, 1))
    # keep=2 on each node's disk: step 5 (the last) and 4 stay; each disk names the run it belongs to.
    assert sorted(names(node0)) == sorted(names(node1)) == [".llmtrain-run", "step-0000004", "step-0000005"]
    for step in ("step-0000004", "step-0000005"):
        assert names(node0 / step) == {".metadata", "__0_0.distcp", "config.yaml", "meta.json"}
        assert names(node1 / step) == {"__1_0.distcp", "meta.json"}
        same = (node0 / step / "meta.json").read_bytes() == (node1 / step / "meta.json").read_bytes()
        files = json.loads((node0 / step / "meta.json").read_text())["files"]
        assert same and set(files) == {".metadata", "__0_0.distcp", "__1_0.distcp", "config.yaml"}
    # The folder the launcher's node sees does not hold the checkpoint: nothing was written outside the disks.
    assert not any(node_local_run["local_dir"].iterdir()) if node_local_run["local_dir"].exists() else True


def test_node_zero_commits_the_store_copy_once_both_parts_are_there(node_local_run):
    location = node_local_run["location"]
    # Uploaded: every 2nd save (step 4), and the last one (step 5) as the run ended.
    assert [i.step for i in node_local_run["stored"]] == [4, 5]
    for step, meta in node_local_run["metas"].items():
        assert set(meta["files"]) == {".metadata", "__0_0.distcp", "__1_0.distcp", "config.yaml"}
        assert node_local_run["leftovers"][step] == {"meta.json"}  # no node's upload marker outlives the commit
    log = node_local_run["first_log"]
    assert f"checkpoint step 5: uploading to {location} before exiting" in log
    assert re.search(rf"uploaded checkpoint step 5 -> {location}/step-0000005 \(this node's \d+\.\d MiB", log)


def test_the_store_copy_resumes_with_the_losses_of_an_uninterrupted_run(node_local_run, tmp_path):
    log = (node_local_run["run_dir"] / "logs" / "rank0.log").read_text()
    assert f"resumed from {node_local_run['location']}/step-0000005 at step 5" in log, log[-2000:]
    reference = tmp_path / "reference"
    train_in_process(reference, *ARGS, "checkpoint.interval=0")
    got, want = train_losses(node_local_run["run_dir"]), train_losses(reference)
    assert sorted(got) == list(range(1, 11))
    assert max(abs(got[s] - want[s]) for s in want) <= 1e-5, (got, want)
