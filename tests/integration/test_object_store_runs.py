"""Runs whose checkpoints go to an object store (a moto S3 server on loopback, reached by the ranks through the real
client stack): a rank killed mid-run resumes from the store with the uninterrupted run's losses, and again under
another layout; retention on the store; an incomplete remote folder ignored, said once and removed; the fast tier's
uploads through throttling and cut connections (helpers.s3_faults); a missing bucket refused before launch; the
newest checkpoint taken from the fast tier.

Few launches, shared by module fixtures: one real `llmtrain launch` (the kill and torchrun's restart), one CLI
refusal, the rest in-process (helpers.inprocess_run)."""

from __future__ import annotations

import io
import json
import os
import re
import signal
import subprocess
import sys
import threading

import pytest
from conftest import SMALL, read_rows, run_cli, train_losses, wait_for, worker_processes
from helpers import s3_server as s3
from helpers.inprocess_run import train_in_process as train
from helpers.s3_faults import FaultProxy
from rich.console import Console

from llmtrain.checkpoint import store

pytestmark = pytest.mark.slow
BASE = SMALL + ["train.max_steps=16", "train.global_batch_size=8", "train.micro_batch_size=2",
                "checkpoint.interval=4", "checkpoint.keep=2"]
STOP = "train.stop_at_step=12"


def max_diff(a: dict, b: dict, steps) -> float:
    return max(abs(a[s] - b[s]) for s in steps)


def store_names(fs, uri: str) -> list[str]:
    """The step folders under a store location, straight from the store (not the run's name in .llmtrain-run)."""
    key = uri[len("s3://"):]
    return sorted(name for p in fs.ls(key, refresh=True) if (name := p.rsplit("/", 1)[-1]).startswith("step-"))


def rank0_log(run_dir) -> str:
    return (run_dir / "logs" / "rank0.log").read_text()


@pytest.fixture(scope="module")
def env(s3_server):
    """This process (and what it starts or forks) pointed at the test S3 server."""
    with pytest.MonkeyPatch.context() as mp:
        for key, value in s3_server.env.items():
            mp.setenv(key, value)
        s3.fresh_clients()
        yield s3_server
    s3.fresh_clients()


def start_killed(env, base):
    """A real launch saving to the store, rank 1 killed with -9 after step 5 (it sleeps 1 s at step 6, so the kill
    lands mid-run), torchrun's restart resuming from the store; stopped at step 12. Returns the launch and the
    thread that kills the rank."""
    run_dir = base / "run"
    uri = f"s3://{env.bucket('objstore')}/runs/killed"
    proc = subprocess.Popen([sys.executable, "-m", "llmtrain", "launch", f"run.dir={run_dir}", *BASE, STOP,
                             f"checkpoint.dir={uri}", "launch.max_restarts=1"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "LLMTRAIN_INJECT_SLOWDOWN": "1:1s:6:6"})
    killed: list = []

    def kill_rank_1() -> None:
        if wait_for(lambda: any(r.get("step", 0) >= 5 for r in read_rows(run_dir)), timeout=180):
            killed.extend(p for p in worker_processes(run_dir) if "llmtrain.worker" in " ".join(p.cmdline())
                          and p.environ().get("RANK") == "1")
            if killed:
                killed[0].send_signal(signal.SIGKILL)

    killer = threading.Thread(target=kill_rank_1, daemon=True)
    killer.start()
    return {"dir": run_dir, "uri": uri, "proc": proc, "killer": killer, "victims": killed}


def finish_killed(run: dict) -> dict:
    """The launch's output and exit code, and whether rank 1 was killed: checked by the tests that read the run, so
    that a failed launch fails them alone."""
    proc = run.pop("proc")
    try:
        out, _ = proc.communicate(timeout=300)
    finally:
        proc.kill()
    run.pop("killer").join(timeout=10)
    return dict(run, out=out, returncode=proc.returncode, killed=bool(run.pop("victims")))


@pytest.fixture(scope="module")
def runs(env, tmp_path_factory):
    """The killed launch and the fast tier's in-process run, at the same time: much of a launch is waiting (start-up,
    the rendezvous, the restart), and so is an upload's retrying."""
    killed = start_killed(env, tmp_path_factory.mktemp("killed"))
    try:
        fast = run_fast_tier(env, tmp_path_factory.mktemp("fast"))
    finally:
        killed = finish_killed(killed)
    return {"killed": killed, "fast": fast}


@pytest.fixture(scope="module")
def killed(runs):
    run = runs["killed"]
    assert run["killed"], f"rank 1 was never killed:\n{run['out'][-3000:]}"
    assert run["returncode"] == 0, run["out"][-3000:]
    return run


@pytest.fixture(scope="module")
def fast_tier(runs):
    return runs["fast"]


def test_a_killed_rank_resumes_from_the_store_with_the_same_losses(killed, fast_tier, s3_server):
    run_dir, uri, out = killed["dir"], killed["uri"], killed["out"]
    assert json.loads((run_dir / "logs" / "rank0.status").read_text())["restart"] == 1
    resumed = re.search(rf"restart 1 of 1: resumed from {uri}/step-(\d{{7}}) at step (\d+) ", out)
    assert resumed and int(resumed[1]) == int(resumed[2]) in (4, 8), out[-3000:]  # the kill came after step 5
    losses = train_losses(run_dir)
    assert sorted(losses) == list(range(1, 13))
    assert max_diff(losses, fast_tier["losses"], range(1, 13)) <= 1e-6
    # Retention on the store (checkpoint.keep=2); nothing on local disk.
    assert store_names(s3_server.filesystem(), uri) == ["step-0000008", "step-0000012"]
    assert not (run_dir / "checkpoints").exists()
    assert not worker_processes(run_dir)


def test_another_layout_resumes_from_the_store_past_an_incomplete_folder(killed, fast_tier, s3_server, tmp_path):
    """A new run directory on another layout (ZeRO-3) resumes from the killed run's store. An upload cut off before
    its meta.json (newer than the newest complete checkpoint) is ignored, said once by the launcher, removed when the
    workers start; training continues with the uninterrupted run's losses."""
    run_dir, uri = tmp_path / "run", killed["uri"]
    fs = s3_server.filesystem()
    key = uri[len("s3://"):]
    fs.copy(f"{key}/step-0000012/.metadata", f"{key}/step-0000014/.metadata")
    said = Console(record=True, width=300, file=io.StringIO())
    train(run_dir, *BASE, f"checkpoint.dir={uri}", "parallel.zero=3", console=said)
    text = said.export_text()
    line = f"ignoring incomplete checkpoint {uri}/step-0000014 (its save did not finish)"
    assert text.count("ignoring incomplete checkpoint") == 1 and line in text, text
    assert f"resuming from {uri}/step-0000012 with these changes:" in text
    log = rank0_log(run_dir)
    assert "ignoring incomplete checkpoint" not in log  # the launcher's word only
    assert ("llmtrain: removed 1 partial checkpoint folder(s) left by saves that did not finish: step-0000014\n"
            in log), log
    assert re.search(rf"resumed from {uri}/step-0000012 at step 12 .*; resharded from layout", log), log
    losses = train_losses(run_dir)
    assert sorted(losses) == list(range(13, 17))
    assert max_diff(losses, fast_tier["losses"], range(13, 17)) <= 1e-5
    assert store_names(fs, uri) == ["step-0000012", "step-0000016"]


def run_fast_tier(env, base):
    """16 steps at DP2, never stopped (the reference of the other runs), saving to a fast tier
    (checkpoint.local_dir), each save uploaded (checkpoint.upload_every=1) through the fault proxy: the upload of
    step 16, the run's last, is throttled on its first try and cut mid-shard on its second."""
    run_dir, local = base / "run", base / "fast"
    uri = f"s3://{env.bucket('objstore')}/runs/fast"
    proxy = FaultProxy(env.endpoint).start()
    proxy.throttle(5, only="/step-0000016/__0_0.distcp")  # s3fs's five tries of rank 0's shard
    # Rank 1's shard, on each of the client's ten tries; drained, so that the client counts ten tries every time.
    proxy.cut_put(1, times=10, only="/step-0000016/__1_0.distcp", drain=True)
    overrides = [*BASE, f"checkpoint.dir={uri}", f"checkpoint.local_dir={local}", "checkpoint.upload_every=1"]
    try:
        with pytest.MonkeyPatch.context() as mp:
            mp.setenv("AWS_ENDPOINT_URL", proxy.endpoint)
            for name, value in s3.QUICK_RETRIES.items():
                mp.setenv(name, value)
            s3.fresh_clients()
            train(run_dir, *overrides)
    finally:
        proxy.stop()
        s3.fresh_clients()  # the launcher's checks in this process met the store through the proxy
    return {"dir": run_dir, "local": local, "uri": uri, "overrides": overrides, "proxy": proxy,
            "losses": train_losses(run_dir)}


def test_fast_tier_uploads_retry_through_throttling_and_a_cut_connection(fast_tier, s3_server):
    run_dir, uri, local, proxy = fast_tier["dir"], fast_tier["uri"], fast_tier["local"], fast_tier["proxy"]
    log = rank0_log(run_dir)
    target = f"llmtrain: warning: upload of checkpoint step 16 to {uri} failed"
    stays = f"the local copy stays at {local}/step-0000016"
    warnings = [line for line in log.splitlines() if line.startswith(target)]
    assert len(warnings) == 2, log
    # Each names the file and gives the store's words, then says it retries, and where the local copy stays.
    throttled = f"{target} ({uri}/step-0000016/__0_0.distcp: "
    assert warnings[0].startswith(throttled) and warnings[0].endswith(
        f"[Errno 16] Please reduce your request rate.); retrying in 1 s; {stays}"), warnings[0]
    shard = f"{uri}/step-0000016/__1_0.distcp"
    # (The client's words are cut at 300 characters: the URL's end may be missing.)
    closed = (f"{target} ({shard}: the store's endpoint cannot be reached (AWS_ENDPOINT_URL="
              f"{proxy.endpoint}): Connection was closed before we received a valid response from endpoint URL: "
              f'"{proxy.endpoint}/')
    assert warnings[1].startswith(closed) and warnings[1].endswith(f"); retrying in 2 s; {stays}"), warnings[1]
    assert re.search(rf"llmtrain: uploaded checkpoint step 16 -> {uri}/step-0000016 \(", log), log
    assert len(proxy.requests(status=503)) == 5 and len(proxy.requests(status="cut")) == 10
    # The commit came last: the one meta.json of step 16 the store took is its last PUT.
    puts = [r.key for r in proxy.requests("PUT", 200) if "/step-0000016/" in r.key]
    assert puts[-1].endswith("/meta.json") and sum(p.endswith("/meta.json") for p in puts) == 1
    # The store ends with the run's last checkpoint committed and whole; every store folder is complete.
    infos = store.list_checkpoints(uri)
    assert infos[-1].step == 16 and all(i.complete for i in infos), infos
    store.verify(f"{uri}/step-0000016")
    assert sorted(p.name for p in local.iterdir()) == [".llmtrain-run", "step-0000012", "step-0000016"]  # retention


def test_the_newest_checkpoint_only_in_the_fast_tier_is_resumed_and_said(fast_tier, s3_server):
    """As if step 16's upload had been cut before its commit: the store holds it without meta.json, the fast tier
    whole. A longer run resumes from the fast tier's copy and says so, never from the half upload, which the
    launch removes."""
    run_dir, uri, local = fast_tier["dir"], fast_tier["uri"], fast_tier["local"]
    s3_server.filesystem().rm_file(f"{uri[5:]}/step-0000016/meta.json")
    said = Console(record=True, width=300, file=io.StringIO())
    train(run_dir, *fast_tier["overrides"], "train.max_steps=20", console=said)
    log = rank0_log(run_dir)
    assert (f"llmtrain: checkpoint.resume=auto -> {local}/step-0000016 (auto: newest complete checkpoint "
            "step-0000016 (the fast tier, checkpoint.local_dir))\n") in log, log
    assert f"resumed from {local}/step-0000016 at step 16 " in log
    assert f"ignoring incomplete checkpoint {uri}/step-0000016 (its save did not finish)" in said.export_text()
    assert "removed 1 partial checkpoint folder(s) left by saves that did not finish: step-0000016\n" in log
    assert sorted(train_losses(run_dir)) == list(range(1, 21))
    # The run's last checkpoint is always uploaded.
    assert re.search(rf"llmtrain: uploaded checkpoint step 20 -> {uri}/step-0000020 \(", log), log
    assert [(i.step, i.complete) for i in store.list_checkpoints(uri)][-1] == (20, True)


def test_a_missing_bucket_is_refused_before_any_worker_starts(env, tmp_path):
    run_dir = tmp_path / "run"
    result = run_cli(["launch", f"run.dir={run_dir}", *BASE, "checkpoint.dir=s3://no-such-bucket-objstore/x"])
    assert result.returncode == 2
    assert result.stderr == ("llmtrain: error: checkpoint.dir: s3://no-such-bucket-objstore/x: no such bucket: The "
                             "specified bucket does not exist\n"), result.stderr
    assert not run_dir.exists()
