"""Shared test setup: one thread per process, a per-session data cache, and helpers that run the real CLI."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from helpers import parallel_workers

os.environ["OMP_NUM_THREADS"] = "1"
# Inductor compiles in the compiling process: on two cores, starting its pool of compile worker processes in every
# rank costs more than the pool gains (a 2-rank compiled run: 54 instead of 67 CPU-seconds).
os.environ["TORCHINDUCTOR_COMPILE_THREADS"] = "1"
REPO = Path(__file__).resolve().parents[1]

# Small, fast model shared by the multi-process tests: 4 layers, width 64, byte-level stdlib text.
SMALL = ["model.d_model=64", "model.seq_len=64", "train.log_interval=1", "train.eval_interval=0",
         "train.warmup_steps=2", "launch.pg_timeout_s=120"]


def pytest_collection_modifyitems(config, items):
    parallel_workers.order_groups(config, items)


@pytest.hookimpl(tryfirst=True)  # before the fixtures are set up
def pytest_runtest_setup(item):
    parallel_workers.refuse_misplaced(item)


@pytest.hookimpl(optionalhook=True)  # called by pytest-xdist's controller; before its own (trylast) scheduler
def pytest_xdist_make_scheduler(config, log):
    return parallel_workers.make_scheduler(config, log)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_node_collection_finished(node, ids):
    parallel_workers.check_scheduler_made(node.config)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item, nextitem):
    with parallel_workers.turn(item):
        return (yield)


@pytest.fixture(scope="session", autouse=True)
def _data_cache(tmp_path_factory):
    cache = tmp_path_factory.mktemp("llmtrain-cache")
    os.environ["LLMTRAIN_CACHE"] = str(cache)
    yield cache


@pytest.fixture(scope="session")
def s3_server():
    """An S3-compatible server on loopback (tests/helpers/s3_server.py); skipped, with the reason, without moto."""
    pytest.importorskip("moto.server", reason="moto[server] is not installed (pip install -e '.[test]')")
    pytest.importorskip("s3fs", reason="s3fs is not installed (pip install -e '.[test]')")
    from helpers import s3_server as s3

    server = s3.start()
    yield server
    server.stop()


@pytest.fixture
def s3(s3_server, monkeypatch):
    """s3_server with this process's environment pointed at it (also what forked ranks inherit)."""
    for key, value in s3_server.env.items():
        monkeypatch.setenv(key, value)
    return s3_server


@pytest.fixture
def s3_faulty(s3_server, monkeypatch):
    """A fault-injecting proxy (tests/helpers/s3_faults.py) in front of s3_server, this process's environment
    pointed at it with the client's own retries cut short (s3_server.QUICK_RETRIES)."""
    from helpers import s3_server as s3
    from helpers.s3_faults import FaultProxy

    proxy = FaultProxy(s3_server.endpoint).start()
    for key, value in {**s3_server.env, **s3.QUICK_RETRIES, "AWS_ENDPOINT_URL": proxy.endpoint}.items():
        monkeypatch.setenv(key, value)
    s3.fresh_clients()
    yield proxy
    proxy.stop()
    s3.fresh_clients()


def run_cli(args: list[str], cwd: Path | str | None = None, timeout: float = 600, env: dict | None = None):
    full_env = dict(os.environ, **(env or {}))
    return subprocess.run([sys.executable, "-m", "llmtrain", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout, env=full_env)


def read_rows(run_dir: Path) -> list[dict]:
    path = Path(run_dir) / "metrics.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def train_losses(run_dir: Path) -> dict[int, float]:
    return {r["step"]: r["loss"] for r in read_rows(run_dir) if "loss" in r}


def launch(run_dir: Path, *overrides: str, timeout: float = 600):
    """Run `llmtrain launch` to completion; assert it succeeded; return the metrics rows."""
    result = run_cli(["launch", f"run.dir={run_dir}", *overrides], timeout=timeout)
    assert result.returncode == 0, f"launch failed ({result.returncode}):\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    return read_rows(run_dir)


def worker_processes(run_dir: Path) -> list[psutil.Process]:
    """Live processes started for this run (torchrun agents and workers mention the run dir)."""
    found = []
    for p in psutil.process_iter(["cmdline"]):
        try:
            cmd = " ".join(p.info["cmdline"] or [])
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        if str(run_dir) in cmd and ("llmtrain.worker" in cmd or "torch.distributed.run" in cmd):
            found.append(p)
    return found


def wait_for(predicate, timeout: float, interval: float = 0.2):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    return predicate()

# The two-node cluster fixture lives here, once, so every module shares one session-scoped instance.
@pytest.fixture
def one_rank(tmp_path):
    """A gloo process group of one rank in this process, for building a Trainer in a test; the signal handlers
    the trainer installs are put back afterwards."""
    import torch.distributed as dist

    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGUSR1)}
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'pg'}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()
    for sig, handler in handlers.items():
        signal.signal(sig, handler)


from cluster_fixture import cluster  # noqa: E402,F401
