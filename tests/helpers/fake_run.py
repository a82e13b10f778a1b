"""Run directories as a launch leaves them, written directly (no training), for the commands that read them."""

from __future__ import annotations

import json
from pathlib import Path

from llmtrain.config import compose_config, to_yaml


def make_run(tmp_path: Path, *overrides: str, steps: int = 4, statuses: dict | None = None,
             checkpoint: int | None = 4, launches: list | None = None, lock: dict | None = None) -> Path:
    """A run directory as a launch leaves it: config.yaml, metrics.jsonl up to `steps`, a checkpoint folder with
    its meta.json, rank status files, job.json and .lock as given."""
    run_dir = tmp_path / "run"
    (run_dir / "logs").mkdir(parents=True)
    cfg = compose_config([f"run.dir={run_dir}", "train.max_steps=4", *overrides])
    (run_dir / "config.yaml").write_text(to_yaml(cfg))
    rows = [{"step": s, "loss": 5.0 - s / 4, "tokens_per_s": 1000.0 + s, "mfu": 0.125, "peak_tflops": 8.0,
             "elapsed_s": 2.5 * s}
            for s in range(1, steps + 1)]
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows + [{"step": steps,
                                                                                           "val_loss": 3.9}]))
    if checkpoint is not None:
        folder = run_dir / "checkpoints" / f"step-{checkpoint:07d}"
        folder.mkdir(parents=True)
        (folder / "meta.json").write_text(json.dumps({"step": checkpoint, "files": {}}))
    for rank, status in (statuses or {}).items():
        (run_dir / "logs" / f"rank{rank}.status").write_text(json.dumps(status))
    if launches is not None:
        (run_dir / "job.json").write_text(json.dumps({"launches": launches}))
    if lock is not None:
        (run_dir / ".lock").write_text(json.dumps(lock))
    return run_dir
