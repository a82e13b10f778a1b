"""A rank whose training is over ignores preemption signals through its teardown: Python gives a handled signal its
default action back while the interpreter exits, and a time-limit notice (USR1 to every process of a Slurm job's
steps) arriving then killed finished ranks and failed a start that had reached train.max_steps."""

from __future__ import annotations

import json
import signal

import pytest
from conftest import SMALL
from helpers.inprocess_run import prepare_launch
from helpers.ranks import run_ranks

pytestmark = pytest.mark.slow

SIGNALS = (signal.SIGTERM, signal.SIGUSR1)


def _run_worker(rank: int, world_size: int, run_dir: str, preempted: bool):
    from llmtrain import worker
    from llmtrain.train import preemption

    if preempted:  # as if the notice came before the first step: checkpoint there and stop
        install = preemption.PreemptionFlag.__init__

        def requested_at_once(self):
            install(self)
            self.requested = True

        preemption.PreemptionFlag.__init__ = requested_at_once
    code = worker.main([run_dir])
    return code, [signal.getsignal(sig) for sig in SIGNALS]


@pytest.mark.parametrize("preempted", [False, True], ids=["finished", "preempted"])
def test_a_rank_done_training_ignores_a_late_notice(tmp_path, preempted):
    run_dir = tmp_path / "run"
    world = prepare_launch(run_dir, *SMALL, "data=synthetic", "train.max_steps=2", "cluster.nproc_per_node=2")
    results = run_ranks(world, _run_worker, str(run_dir), preempted, init_group=False)
    statuses = [json.loads((run_dir / "logs" / f"rank{r}.status").read_text())["status"] for r in range(world)]
    assert statuses == ["preempted" if preempted else "ok"] * world
    assert results == [(0, [signal.SIG_IGN] * 2)] * world
