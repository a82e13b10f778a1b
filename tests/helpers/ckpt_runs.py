"""A tiny GPT trained in the test process (one gloo rank, or one rank of a forked group) with checkpoints at steps 2
and 4, and the readers the checkpoint tests share: `llmtrain ckpt` in-process, DCP's full state, the one shard."""

from __future__ import annotations

import signal
import warnings
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint.metadata import TensorStorageMetadata

from llmtrain.cli import main
from llmtrain.config import compose_config
from llmtrain.launch.config_probes import validate_here


TINY = ["data=synthetic", "model.n_layers=2", "model.d_model=32", "model.n_heads=2", "model.seq_len=32",
        "train.micro_batch_size=4", "train.global_batch_size=4", "train.log_interval=1", "train.eval_interval=0",
        "train.warmup_steps=1", "train.lr=1e-2", "train.max_steps=4", "checkpoint.interval=2", "checkpoint.keep=5"]


def train(run_dir: Path, rank: int = 0, world: int = 1, overrides: tuple[str, ...] = ()) -> None:
    import torch.distributed as dist

    from llmtrain.train.trainer import Trainer

    cfg = compose_config([*TINY, f"run.dir={run_dir}", f"cluster.nproc_per_node={world}", *overrides])
    validate_here(cfg)
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGUSR1)}
    dist.init_process_group("gloo", init_method=f"file://{run_dir}/pg-store", rank=rank, world_size=world)
    try:
        Trainer(cfg, str(run_dir), torch.device("cpu")).train()
    finally:
        dist.destroy_process_group()
        for sig, handler in handlers.items():
            signal.signal(sig, handler)


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    run_dir = tmp_path_factory.mktemp("ckv") / "run"
    run_dir.mkdir()
    train(run_dir)
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == ["step-0000002", "step-0000004"]
    return run_dir


def cli(capsys, *args: str) -> tuple[int, str, str]:
    code = main(["ckpt", *args])
    out = capsys.readouterr()
    return code, out.out, out.err


def full_state(path: Path) -> dict[str, torch.Tensor]:
    """Every model and optimizer tensor of a checkpoint, loaded at once by DCP (the test's own reading)."""
    md = FileSystemReader(str(path)).read_metadata()
    state = {k: torch.empty(tuple(m.size), dtype=m.properties.dtype) for k, m in md.state_dict_metadata.items()
             if isinstance(m, TensorStorageMetadata) and k.startswith(("model.", "optim."))}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.load(state, checkpoint_id=str(path), no_dist=True)
    return state


def shard(path: Path) -> Path:
    (only,) = path.glob("*.distcp")
    return only
