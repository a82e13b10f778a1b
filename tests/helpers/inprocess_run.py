"""`llmtrain launch` without the launcher processes: the run directory is prepared as the launcher prepares it, then
llmtrain.worker runs on every rank, forked from the test process (helpers.ranks).

For tests of what the trainer computes (parity between layouts, sharding, resume): they keep the real config
composition, data preparation, resume check, run directory and worker (status files, rank logs, metrics.jsonl),
and skip torchrun and the interpreter start-up of every rank. Tests of the launcher itself use conftest.launch.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from rich.console import Console

from helpers.ranks import run_ranks


def _worker(rank: int, world_size: int, run_dir: str) -> int:
    from llmtrain import worker

    # A rank forks from a server started long before; a fresh interpreter would read the test's PYTHONPATH.
    sys.path[:0] = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and p not in sys.path]

    return worker.main([run_dir])


def prepare_launch(run_dir: Path, *overrides: str, console: Console | None = None) -> int:
    """What `llmtrain launch run.dir=RUN_DIR OVERRIDES...` does before starting workers; the world size. What the
    launcher says meanwhile (the resume and what changed) goes to `console`."""
    from llmtrain.launch.config_probes import compose_here, validate_here
    from llmtrain.launch.run import check_resume, prepare_data, prepare_run_dir
    from llmtrain.parallel.layout import ParallelDims

    origins: dict[str, str] = {}
    cfg = compose_here([f"run.dir={run_dir}", *overrides], origins=origins)
    validate_here(cfg)
    cfg.run.dir = os.path.abspath(cfg.run.dir)
    prepare_data(cfg)
    # The launcher's refusals; the worker resolves the resume itself.
    check_resume(cfg, console or Console(quiet=True), origins)
    prepare_run_dir(cfg)
    return ParallelDims.from_config(cfg).world_size


def train_in_process(run_dir: Path, *overrides: str, timeout: float = 600, console: Console | None = None) -> list[dict]:
    """Train like `llmtrain launch run.dir=RUN_DIR OVERRIDES...` on one node; assert every rank ended "ok"; return
    the metrics rows. What the launcher says before training (the resume and what changed) goes to `console`."""
    world_size = prepare_launch(run_dir, *overrides, console=console)
    # The worker initializes the process group itself, from the env:// variables the harness sets.
    logs = Path(run_dir) / "logs"
    try:
        codes = run_ranks(world_size, _worker, str(run_dir), timeout=timeout, init_group=False)
    except AssertionError as e:
        tails = "\n".join(f"--- {p.name}:\n{p.read_text(errors='replace')[-2000:]}" for p in sorted(logs.glob("*.log")))
        raise AssertionError(f"{e}\n{tails}") from None
    statuses = [json.loads((logs / f"rank{r}.status").read_text()) for r in range(world_size)]
    bad = [(r, s["status"], s["error"]) for r, s in enumerate(statuses) if s["status"] != "ok"]
    assert codes == [0] * world_size and not bad, (bad, (logs / "rank0.log").read_text()[-3000:])
    path = Path(run_dir) / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
