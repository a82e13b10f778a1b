"""When the launcher calls a job hung, from the ranks' progress and status files (no processes)."""

from __future__ import annotations

import json
import re
import time

from llmtrain.launch.supervision.hang_watch import HangWatch
from llmtrain.rundir.hang_files import progress_path


def beat(run_dir, rank: int, steps: int, median_s: float = 0.01, restart: int = 0) -> None:
    path = progress_path(str(run_dir), rank)
    with open(path, "w") as f:
        json.dump({"step": steps, "steps": steps, "restart": restart, "median_step_s": median_s}, f)


def test_no_verdict_before_the_first_step_then_a_stalled_rank_is_named(tmp_path):
    (tmp_path / "logs").mkdir()
    watch = HangWatch(str(tmp_path), world_size=2, timeout_s=1.0)
    time.sleep(1.2)
    assert watch.poll() is None  # start-up: only the rendezvous and process-group timeouts apply
    beat(tmp_path, 0, 1)
    beat(tmp_path, 1, 1)
    assert watch.poll() is None
    time.sleep(0.6)
    beat(tmp_path, 0, 2)
    assert watch.poll() is None
    time.sleep(0.6)
    why = watch.poll()  # rank 1 quiet for 1.2 s, rank 0 for 0.6 s
    assert why is not None and re.fullmatch(r"no step completed for 1 s \(rank 1 at step 1\); the bound is "
                                            r"max\(launch.hang_timeout_s=1, 10 x median step 0.01 s\) = 1 s", why), why


def test_the_bound_grows_with_the_median_step_and_a_restart_starts_over(tmp_path):
    (tmp_path / "logs").mkdir()
    watch = HangWatch(str(tmp_path), world_size=1, timeout_s=0.1)
    beat(tmp_path, 0, 3, median_s=0.05)
    watch.poll()
    assert watch.bound_s() == 0.5
    time.sleep(0.3)
    assert watch.poll() is None  # 0.3 s < 10 x 0.05 s
    beat(tmp_path, 0, 0, restart=1)  # torchrun restarted the workers: no step of the new attempt yet
    time.sleep(0.6)
    assert watch.poll() is None and watch.armed_at is None


def test_a_collective_timeout_in_a_fresh_status_is_said_once(tmp_path):
    (tmp_path / "logs").mkdir()
    watch = HangWatch(str(tmp_path), world_size=2, timeout_s=300)
    (tmp_path / "logs" / "rank0.status").write_text(json.dumps(
        {"status": "error", "error": "RuntimeError: [gloo] Timed out waiting 10000ms for recv operation"}))
    assert watch.poll() == "rank 0 timed out in a collective (launch.pg_timeout_s)"
    assert watch.poll() is None


def test_a_rank_in_an_eval_or_a_save_is_not_timed_by_its_step_time(tmp_path):
    from llmtrain.train.progress_beat import ProgressBeat

    (tmp_path / "logs").mkdir()
    watch = HangWatch(str(tmp_path), world_size=1, timeout_s=0.3)
    progress = ProgressBeat(str(tmp_path), 0)
    progress.step_done(1, 0.01)
    assert watch.poll() is None
    with progress.phase("checkpoint"):
        assert watch.poll() is None
        time.sleep(0.5)  # a save longer than the bound
        assert watch.poll() is None
    assert watch.poll() is None  # the phase's end is progress: the clock starts again
    time.sleep(0.5)
    assert watch.poll().startswith("no step completed for ")  # 0.5 s after the save, over the 0.3 s bound
    assert "(rank 0 at step 1)" in watch.poll()
