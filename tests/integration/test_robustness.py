"""The launcher under abuse: repeated Ctrl-C, early or useless SIGTERM, busy ports, rendezvous that never completes,
hung ranks, unwritable folders, token files that lie about their dtype, plans that do not fit."""

from __future__ import annotations

import json
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import psutil
import pytest
from conftest import REPO, SMALL, read_rows, run_cli, wait_for, worker_processes
from omegaconf import OmegaConf
from rich.console import Console

from llmtrain.config import ConfigError, compose_config
from llmtrain.launch.config_probes import validate_here
from llmtrain.data import DataError, build_dataset
from llmtrain.launch import preflight
from llmtrain.launch.supervision.failures import report_failure
from llmtrain.launch.supervision.monitor import Monitor
from llmtrain.launch.run import EXIT_PREEMPTED, preempt

FAST = ["data=synthetic", "train.max_steps=2"]
# A rendezvous that cannot complete: node 0 of 2 waits for a node 1 that is never started (127.0.0.2 is this host
# too, but not the loopback name the local backend refuses for nnodes > 1).
NEVER_JOINS = ["cluster.nnodes=2", "cluster.nproc_per_node=1", "cluster.master_addr=127.0.0.2"]


def _start(run_dir: Path, *overrides: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "llmtrain", "launch", f"run.dir={run_dir}", *overrides],
                            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _finish(proc: subprocess.Popen, timeout: float) -> tuple[str, float]:
    """The launcher's output and how long it took to exit from now."""
    start = time.monotonic()
    try:
        out, _ = proc.communicate(timeout=timeout)
    finally:
        proc.kill()
    return out, time.monotonic() - start


def _cmdline(p: psutil.Process) -> list[str]:
    try:
        return p.cmdline()
    except psutil.Error:
        return []


def _worker_of_rank(run_dir: Path, rank: int) -> psutil.Process | None:
    for p in worker_processes(run_dir):
        try:
            if "llmtrain.worker" in p.cmdline() and "torch.distributed.run" not in p.cmdline() \
                    and p.environ().get("RANK") == str(rank):
                return p
        except psutil.Error:
            continue
    return None


def _nothing_left(run_dir: Path) -> bool:
    return wait_for(lambda: not worker_processes(run_dir), timeout=10)


def _errors(result) -> list[str]:
    return [line for line in (result.stdout + result.stderr).splitlines() if line.strip()]


# ---- refused before anything starts: one line, exit 2, nothing written --------------------------------------------

def test_busy_master_port_is_refused_at_once(tmp_path):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        start = time.monotonic()
        result = run_cli(["launch", f"run.dir={tmp_path / 'run'}", *FAST, f"cluster.master_port={port}"],
                         timeout=60)
    assert time.monotonic() - start < 30
    assert result.returncode == 2, result.stdout + result.stderr
    assert _errors(result) == [f"llmtrain: error: cluster.master_port: port {port} on 127.0.0.1 is in use by "
                               "another process; pick another or leave it 0 for a free one"]
    assert not (tmp_path / "run").exists()


def test_port_in_use_on_any_address():
    for host in ("127.0.0.1", "0.0.0.0"):
        with socket.socket() as s:
            s.bind((host, 0))
            s.listen()
            port = s.getsockname()[1]
            assert preflight.port_in_use(port)
        assert not preflight.port_in_use(port)  # closed: free again


def test_plan_far_over_memory_is_refused_by_default(tmp_path):
    # 269 GiB per rank by the plan: over 1.5x any machine these tests run on, CPU or GPU.
    result = run_cli(["launch", f"run.dir={tmp_path / 'run'}", "data=synthetic", "model.seq_len=1000000"],
                     timeout=120)
    assert result.returncode == 2, result.stdout + result.stderr
    lines = _errors(result)
    assert len(lines) == 1, lines
    assert re.match(r"llmtrain: error: launch\.max_memory_ratio: the plan's peak memory is 26\d\.\d GiB per rank .* "
                    r"but (this machine's|the GPU's) memory is [\d.,]+ GiB \([\d.]+x; see llmtrain plan\), over "
                    r"1\.5x: .* or launch\.max_memory_ratio=null to start anyway$", lines[0]), lines
    assert not (tmp_path / "run").exists()


def _memory_for(cfg, ratio: float):
    """This node's memory as `ratio` times below the plan's two ranks."""
    peak = preflight.planned_peak_bytes(cfg)
    return lambda _: (peak * 2 / ratio, 2, "this machine's memory")


def test_plan_over_memory_warns_below_the_margin_and_is_refused_over_it(monkeypatch, capsys):
    cfg = compose_config(["data=synthetic"], [])
    validate_here(cfg)
    peak = preflight.planned_peak_bytes(cfg)
    monkeypatch.setattr(preflight, "node_memory", _memory_for(cfg, 1.25))
    preflight.warn_memory_fit(cfg)
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 1 and lines[0].startswith("llmtrain: warning: the plan's peak memory is "), lines
    assert f"per rank x 2 ranks = {preflight._gib(2 * peak)} but this machine's memory is " in lines[0]
    assert "(1.25x; see llmtrain plan); the job will likely run out of memory" in lines[0]
    cfg.launch.require_fit = True  # any excess refused
    with pytest.raises(ConfigError) as info:
        preflight.warn_memory_fit(cfg)
    assert info.value.key == "launch.require_fit" and "(1.25x; " in info.value.message
    cfg.launch.require_fit = False
    monkeypatch.setattr(preflight, "node_memory", _memory_for(cfg, 1.6))  # over the margin: refused by default
    with pytest.raises(ConfigError) as info:
        preflight.warn_memory_fit(cfg)
    assert info.value.key == "launch.max_memory_ratio" and "(1.60x; see llmtrain plan), over 1.5x" in info.value.message
    cfg.launch.max_memory_ratio = None  # the way to start anyway: a warning again
    preflight.warn_memory_fit(cfg)
    assert "(1.60x; see llmtrain plan); the job will likely run out of memory" in capsys.readouterr().out
    # The default gpt-tiny fits this machine: no word from a launch.
    cfg.launch.max_memory_ratio = 1.5
    monkeypatch.undo()
    preflight.warn_memory_fit(cfg)
    assert capsys.readouterr().out == ""


def test_dry_run_states_the_memory_verdict(tmp_path, monkeypatch, capsys):
    from llmtrain.cli import main

    monkeypatch.setattr(preflight, "node_memory", lambda cfg: (23.5 * 2**30, 2, "this machine's memory"))
    run_dir = tmp_path / "run"
    assert main(["launch", "--dry-run", "data=synthetic", f"run.dir={run_dir}"]) == 0
    last = capsys.readouterr().out.splitlines()[-1]
    assert re.fullmatch(r"llmtrain: the plan's peak memory is \d+ MiB per rank x 2 ranks = \d+ MiB and this "
                        r"machine's memory is 23\.5 GiB \(under 0\.01x; see llmtrain plan\)", last), last
    assert main(["launch", "--dry-run", "model=gpt-13b", "data=synthetic", f"run.dir={run_dir}"]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.count("\n") == 1
    assert captured.err.startswith("llmtrain: error: launch.max_memory_ratio: the plan's peak memory is 394.4 GiB "
                                   "per rank x 2 ranks = 788.8 GiB but this machine's memory is 23.5 GiB (33.57x; ")
    assert main(["launch", "--dry-run", "model=gpt-13b", "data=synthetic", "launch.max_memory_ratio=null",
                 f"run.dir={run_dir}"]) == 0
    assert capsys.readouterr().out.splitlines()[-1].startswith("llmtrain: warning: the plan's peak memory is 394.4 GiB")
    # Another backend's nodes are not this machine: the peak is stated, not compared. Its 8 ranks share the 16
    # samples of a step, so each trains micro-batches of 2 (8 above) and plans a smaller peak.
    assert main(["launch", "--dry-run", "model=gpt-13b", "data=synthetic", "cluster=slurm", "cluster.nnodes=1",
                 f"run.dir={run_dir}"]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == (
        "llmtrain: the plan's peak memory is 243.7 GiB per rank; the memory of cluster=slurm's nodes is not known "
        "here, so it is not compared (llmtrain plan hardware=NAME compares it with a GPU's)")
    assert not run_dir.exists()


def test_rendezvous_timeout_must_be_positive(tmp_path):
    result = run_cli(["launch", f"run.dir={tmp_path / 'run'}", *FAST, "launch.rendezvous_timeout_s=0"])
    assert result.returncode == 2
    assert _errors(result) == ["llmtrain: error: launch.rendezvous_timeout_s: must be > 0 (got 0)"]


@pytest.mark.parametrize("cache", ["file", "proc"])
def test_unwritable_stdlib_cache_is_one_line(tmp_path, cache):
    if cache == "file":  # a regular file where the cache folder should be
        (tmp_path / "cache").write_text("not a folder")
        where = tmp_path / "cache"
    else:  # the tests run as root, where chmod stops no write; nothing can be created under /proc
        where = Path("/proc/llmtrain-cache")
    result = run_cli(["launch", f"run.dir={tmp_path / 'run'}", "data=stdlib", "train.max_steps=2"],
                     env={"LLMTRAIN_CACHE": str(where)}, timeout=120)
    assert result.returncode == 2, result.stdout + result.stderr
    lines = _errors(result)
    assert len(lines) == 1 and lines[0].startswith(f"llmtrain: error: data.path: cannot write the stdlib corpus "
                                                   f"{where}/stdlib-bytes.bin"), lines
    assert "LLMTRAIN_CACHE" in lines[0]
    assert not (tmp_path / "run").exists()
    assert [p.name for p in tmp_path.iterdir()] == (["cache"] if cache == "file" else [])


@pytest.mark.parametrize("cwd", ["file", "proc"])
def test_unwritable_current_directory_names_run_dir(tmp_path, cwd):
    # The default run.dir is relative (runs/<model>). As root chmod 0o555 would not stop the write, so the folder
    # cannot be created for other reasons: `runs` is a regular file, or the current directory is /proc.
    if cwd == "file":
        (tmp_path / "runs").write_text("not a folder")
        where = tmp_path
    else:
        where = Path("/proc")
    result = run_cli(["launch", *FAST], cwd=where, env={"PYTHONPATH": str(REPO)}, timeout=120)
    assert result.returncode == 2, result.stdout + result.stderr
    lines = _errors(result)
    assert len(lines) == 1 and lines[0].startswith(f"llmtrain: error: run.dir: cannot write the run directory "
                                                   f"{where}/runs/gpt-tiny"), lines
    if cwd == "file":
        assert [p.name for p in tmp_path.iterdir()] == ["runs"]


def test_token_file_whose_meta_has_the_wrong_dtype_is_named(tmp_path):
    """uint16 tokens under a meta that says uint32 (with a matching count) pass every check made from sizes alone;
    reading them must fail naming the file and the dtype, not with an index error inside the embedding."""
    path = tmp_path / "train.bin"
    (np.arange(20000) % 256).astype(np.uint16).tofile(path)
    meta = {"format": "llmtrain-tokens-v1", "dtype": "uint32", "vocab_size": 256, "num_tokens": 10000}
    (tmp_path / "train.bin.json").write_text(json.dumps(meta))
    data = OmegaConf.create({"name": "memmap", "path": str(path), "dtype": None, "val_fraction": 0.05})
    dataset = build_dataset(data, OmegaConf.create({"seq_len": 64, "vocab_size": 256}), seed=0)
    with pytest.raises(DataError) as info:
        dataset.sample("train", 0)
    message = str(info.value)
    assert message.startswith(f"data.path: {path} holds token id ") and "read as uint32" in message
    assert f"{path}.json says vocab_size 256" in message


# ---- what a failure report says ------------------------------------------------------------------------------------

def _failure(rank: int, code: int, when: str) -> str:
    return (f"[{rank}]:\n  time      : 2026-11-30_00:{when}\n  host      : localhost\n"
            f"  rank      : {rank} (local_rank: {rank})\n  exitcode  : {code} (pid: 7)\n")


HUNG = ("Failures:\n" + _failure(1, -9, "16:12") + "------\nRoot Cause (first observed failure):\n"
        + _failure(0, 1, "15:42"))
GLOO_TIMEOUT = "RuntimeError: [gloo/unbound_buffer.cc:78] Timed out waiting 10000ms for recv operation to complete"


def _report(run_dir: Path, agent_output: str, code: int = 1) -> str:
    console = Console(record=True, width=2000)
    report_failure(console, str(run_dir), agent_output, code, node=0)
    return console.export_text()


def test_a_rank_killed_after_its_peers_timed_out_is_named_hung(tmp_path):
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "rank0.status").write_text(json.dumps({"status": "error", "error": GLOO_TIMEOUT}))
    (logs / "rank0.log").write_text(f"step 2 | loss 5.5\nTraceback (most recent call last):\n{GLOO_TIMEOUT}\n")
    (logs / "rank1.log").write_text("")
    text = _report(tmp_path, HUNG)
    first = text.splitlines()[0]
    assert first.startswith("llmtrain: rank 1 (node 0, host localhost, local rank 1) hung (stopped responding): rank 0 timed out "
                            "waiting for it in a collective"), first
    assert "Timed out waiting 10000ms" in first and "killed (signal 9)" in first
    # Its own log is empty (ranks other than 0 log little): the peer's last lines stand in.
    assert "its log is empty" in text and f"  {GLOO_TIMEOUT}" in text.splitlines()
    # A rank killed before anyone timed out is a plain death.
    early = HUNG.replace("00:16:12", "00:15:00")
    assert "failed (signal 9)" in _report(tmp_path, early).splitlines()[0]


def test_the_culprits_recorded_error_is_in_the_summary_line(tmp_path):
    logs = tmp_path / "logs"
    logs.mkdir()
    enospc = "OSError: [Errno 28] No space left on device: '/ckpt/step-0000005.tmp/__0_0.distcp'"
    for rank in (0, 1):
        (logs / f"rank{rank}.status").write_text(json.dumps({"status": "error", "error": enospc}))
    first = _report(tmp_path, "").splitlines()[0]
    assert first.startswith(f"llmtrain: rank 0 (node 0) failed (job exit code 1): {enospc}; last lines of "), first


def test_a_failure_no_rank_explains_names_what_was_said(tmp_path):
    (tmp_path / "logs").mkdir()
    agent = ("Traceback (most recent call last):\n  File \"run.py\", line 1\n"
             "torch.distributed.DistNetworkError: The server socket has failed to listen on any local network "
             "address. port: 29555\n")
    first = _report(tmp_path, agent).splitlines()[0]
    assert first.startswith("llmtrain: the job failed with exit code 1: torch.distributed.DistNetworkError: The "
                            "server socket has failed to listen"), first
    (tmp_path / "logs" / "rank0.status").write_text(json.dumps({"status": "ok"}))
    assert "no rank reported an error" in _report(tmp_path, "")


# ---- SIGTERM that finds no worker ----------------------------------------------------------------------------------

class _NoWorkers:
    """A backend whose workers have not started: nothing to signal."""

    name = "fake"
    owns_processes = True

    def __init__(self):
        self.stopped = self.followed = False

    def signal_workers(self, sig: int) -> int:
        return 0

    def follow(self, monitor, timeout_s=None):
        self.followed = True
        time.sleep(timeout_s)

    def stop(self) -> None:
        self.stopped = True


def test_preempt_without_workers_stops_at_once(tmp_path, capsys, monkeypatch):
    from llmtrain.launch.supervision import processes

    # The stop ends by killing every process the launcher started, its descendants: here that would be this test
    # process's own children (the rank harness's fork server among them).
    monkeypatch.setattr(processes, "kill_all", lambda run_dir=None: 0)
    cfg = compose_config([f"run.dir={tmp_path}", "launch.preempt_grace_s=60"], [])
    backend = _NoWorkers()
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1)}
    start = time.monotonic()
    try:
        code = preempt(backend, Monitor(str(tmp_path), 10), cfg, "SIGTERM")
    finally:
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
    assert code == EXIT_PREEMPTED and time.monotonic() - start < 5
    assert backend.stopped and not backend.followed
    assert "SIGTERM: no worker is running (none has started yet, or all have ended); stopping the job at once" \
        in capsys.readouterr().out


# ---- real launches (multi-process) ---------------------------------------------------------------------------------

def _catches_sigterm(pid: int) -> bool:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    mask = next(int(line.split()[1], 16) for line in status.splitlines() if line.startswith("SigCgt:"))
    return bool(mask >> (signal.SIGTERM - 1) & 1)


@pytest.mark.slow
@pytest.mark.parametrize("moment", ["handler", "config"])
def test_sigterm_before_the_workers_exist_stops_the_launch(tmp_path, moment):
    """As soon as the launcher handles SIGTERM, or once it has written the run's config (torchrun is about to
    start): exit 143 at once, saying so, and nothing trains."""
    run_dir = tmp_path / "run"
    proc = _start(run_dir, *SMALL, "data=synthetic", "train.max_steps=30")
    if moment == "handler":
        assert wait_for(lambda: _catches_sigterm(proc.pid), timeout=30, interval=0.01)
    else:
        assert wait_for(lambda: (run_dir / "config.yaml").exists(), timeout=60, interval=0.01)
    proc.send_signal(signal.SIGTERM)
    out, took = _finish(proc, timeout=60)
    assert proc.returncode == 143, out
    assert took < 20, out
    assert "SIGTERM: stopped before any worker started" in out or "SIGTERM: no worker is running" in out, out
    assert "Traceback" not in out
    assert not any(r.get("step") == 30 for r in read_rows(run_dir))
    assert _nothing_left(run_dir), worker_processes(run_dir)


@pytest.mark.slow
def test_sigterm_while_the_rendezvous_waits_returns_at_once(tmp_path):
    run_dir = tmp_path / "run"
    proc = _start(run_dir, *SMALL, "data=synthetic", "train.max_steps=30", *NEVER_JOINS)
    assert wait_for(lambda: any("torch.distributed.run" in _cmdline(p) for p in worker_processes(run_dir)),
                    timeout=60)
    time.sleep(1)
    proc.send_signal(signal.SIGTERM)
    out, took = _finish(proc, timeout=60)
    assert proc.returncode == 143, out
    assert took < 15, out  # not launch.preempt_grace_s (120 s)
    assert "SIGTERM: no worker is running" in out, out
    assert _nothing_left(run_dir), worker_processes(run_dir)


@pytest.mark.slow
def test_a_rendezvous_that_never_completes_is_given_up_naming_the_endpoint(tmp_path):
    run_dir = tmp_path / "run"
    proc = _start(run_dir, *SMALL, "data=synthetic", *NEVER_JOINS, "launch.rendezvous_timeout_s=6")
    out, took = _finish(proc, timeout=90)
    assert proc.returncode == 1, out
    assert took < 60, out
    assert "llmtrain: waiting for the rendezvous at 127.0.0.2:" in out, out
    assert "llmtrain: no worker started within 6 s (launch.rendezvous_timeout_s): the rendezvous at 127.0.0.2:" \
        in out, out
    assert _nothing_left(run_dir), worker_processes(run_dir)


@pytest.mark.slow
def test_second_ctrl_c_kills_a_hung_job_at_once(tmp_path):
    run_dir = tmp_path / "run"
    proc = _start(run_dir, *SMALL, "data=synthetic", "train.max_steps=100000")
    try:
        assert wait_for(lambda: read_rows(run_dir), timeout=180), "training never started"
        hung = _worker_of_rank(run_dir, 1)
        assert hung is not None
        hung.suspend()  # SIGSTOP: it will answer no SIGTERM, so the graceful stop would wait out its grace
        proc.send_signal(signal.SIGINT)
        time.sleep(1)
        proc.send_signal(signal.SIGINT)
        out, took = _finish(proc, timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 130, out
    assert took < 9, out  # sooner than the graceful stop's 10 s
    assert "Traceback" not in out and "KeyboardInterrupt" not in out, out
    assert "llmtrain: interrupted again: killed the job's" in out, out
    assert wait_for(lambda: not worker_processes(run_dir), timeout=5), worker_processes(run_dir)


@pytest.mark.slow
def test_a_hung_rank_is_named_as_hung_with_log_lines(tmp_path):
    run_dir = tmp_path / "run"
    proc = _start(run_dir, *SMALL, "data=synthetic", "train.max_steps=100000", "launch.pg_timeout_s=10")
    try:
        assert wait_for(lambda: read_rows(run_dir), timeout=180), "training never started"
        hung = _worker_of_rank(run_dir, 1)
        assert hung is not None
        hung.suspend()
        out, _ = _finish(proc, timeout=150)  # the peer's 10 s timeout, then torchrun's 30 s before SIGKILL
    finally:
        proc.kill()
    assert proc.returncode not in (0, None), out
    lines = out.splitlines()
    named = [i for i, line in enumerate(lines)
             if re.match(r"llmtrain: rank 1 \(node 0, host \S+, local rank 1\) hung \(stopped responding\): rank 0 "
                         "timed out", line)]
    assert named, out[-3000:]
    shown = [line for line in lines[named[0] + 1:] if line.startswith("  ") and line.strip()]
    assert len(shown) >= 2 and any("Timed out" in line for line in shown), out[-3000:]
    assert _nothing_left(run_dir), worker_processes(run_dir)
