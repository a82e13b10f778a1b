"""Run a function on N ranks forked from a warm process: no torchrun, no fresh `import torch` per rank.

A torchrun launch on 2 cores costs ~10 s, mostly interpreter start-up and imports; forking an already-imported
process costs well under a second. Use it where no launcher behaviour is under test. The ranks are forked from a
fork server (started once, with torch and the trainer imported), not from the test process itself: by the time a
test runs, pytest's process may hold threads (gloo's, a checkpoint writer's) and a fork copies their locks in
whatever state they are, which can hang a rank. The test process's environment is passed to every rank.

    results = run_ranks(2, fn, arg)   # fn(rank, world_size, arg) on every rank, inside a gloo process group

Each rank sees RANK, LOCAL_RANK, WORLD_SIZE and MASTER_ADDR/PORT as under torchrun, so code that calls
`dist.init_process_group()` with the env:// method joins the group; with `init_group=True` (the default) the
harness initializes it first and destroys it afterwards. A rank's stdout/stderr go to LOG_DIR/rank{R}.log when
log_dir is given. What fn returns comes back pickled, one entry per rank; a rank that raises, exits non-zero or
outlives the timeout fails the call with the ranks' last output.
"""

from __future__ import annotations

import os
import pickle
import sys
import tempfile
import time
import traceback
from datetime import timedelta
from pathlib import Path

from llmtrain.launch.backends.base import free_port
from llmtrain.worker import redirect_output


def _rank_main(rank, world_size, port, fn, args, out_dir, log_dir, init_group, pg_timeout_s, environ):
    # os._exit on every path: the forked copy must not run teardown or atexit hooks.
    code = 1
    try:
        os.environ.clear()
        os.environ.update(environ)  # the test's, as it is now (monkeypatch.setenv included)
        os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world_size),
                          LOCAL_WORLD_SIZE=str(world_size), GROUP_RANK="0", MASTER_ADDR="127.0.0.1",
                          MASTER_PORT=str(port))
        if log_dir is not None:
            redirect_output(str(Path(log_dir) / f"rank{rank}.log"))
        import torch.distributed as dist

        if init_group:
            dist.init_process_group("gloo", rank=rank, world_size=world_size,
                                    timeout=timedelta(seconds=pg_timeout_s))
        result = fn(rank, world_size, *args)
        if init_group and dist.is_initialized():
            dist.destroy_process_group()
        with open(Path(out_dir) / f"rank{rank}.pkl", "wb") as f:
            pickle.dump(result, f)
        code = 0
    except BaseException:  # noqa: BLE001 - reported to the parent through the log and the exit code
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


_CONTEXT = None
# Imported once by the fork server, so each rank starts with them loaded.
# torch._dynamo: torch imports it at the first model built on the meta device or optimizer made, most of a second.
PRELOAD = ["torch", "torch.distributed", "torch._dynamo", "llmtrain.worker", "llmtrain.train.trainer",
           "helpers.ranks"]


def _context():
    global _CONTEXT
    if _CONTEXT is None:
        import multiprocessing

        _CONTEXT = multiprocessing.get_context("forkserver")
        _CONTEXT.set_forkserver_preload(PRELOAD)
    return _CONTEXT


def _tail(path: Path, chars: int = 3000) -> str:
    return path.read_text(errors="replace")[-chars:] if path.exists() else "(no log)"


def run_ranks(world_size: int, fn, *args, log_dir: str | os.PathLike | None = None, timeout: float = 300,
              init_group: bool = True, pg_timeout_s: int = 120) -> list:
    """fn(rank, world_size, *args) on world_size forked ranks; the per-rank return values, in rank order."""
    ctx = _context()
    port = free_port()
    if log_dir is not None:
        Path(log_dir).mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="ranks-") as out_dir:
        procs = [ctx.Process(target=_rank_main, daemon=False,
                             args=(r, world_size, port, fn, args, out_dir, log_dir, init_group, pg_timeout_s,
                                   dict(os.environ)))
                 for r in range(world_size)]
        for p in procs:
            p.start()
        deadline = time.monotonic() + timeout
        # One failed rank leaves the others waiting in a collective: stop them all at the first failure.
        while any(p.is_alive() for p in procs) and time.monotonic() < deadline:
            if any(p.exitcode not in (None, 0) for p in procs):
                break
            time.sleep(0.05)
        for p in procs:
            if p.is_alive():
                p.kill()
            p.join()
        codes = [p.exitcode for p in procs]
        if any(code != 0 for code in codes):
            logs = "\n".join(f"--- rank {r} (exit {codes[r]}):\n{_tail(Path(log_dir) / f'rank{r}.log')}"
                             if log_dir is not None else f"--- rank {r}: exit {codes[r]}"
                             for r in range(world_size))
            timed_out = " (timed out)" if time.monotonic() >= deadline else ""
            raise AssertionError(f"run_ranks{timed_out}: exit codes {codes}\n{logs}")
        results = []
        for r in range(world_size):
            with open(Path(out_dir) / f"rank{r}.pkl", "rb") as f:
                results.append(pickle.load(f))
        return results
