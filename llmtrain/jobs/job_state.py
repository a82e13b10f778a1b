"""Which state the job behind a run directory is in, from what the launcher and the ranks leave on disk.

A live job holds RUN_DIR/.lock: its launcher (local, ssh, or a Slurm launcher following its job, which names the
job in the lock once sbatch took it) or, once that launcher has exited, its Slurm job. Whether the holder still runs comes from the lock's own check (holder_gone)
and, for Slurm, from `scontrol show job`. A job that no longer runs ended as its ranks recorded
(logs/rank{R}.status: ok, preempted or error), and as its launcher recorded in job.json (its exit code: Ctrl-C
and `llmtrain cancel --now` make it 130).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from llmtrain.errors import EXIT_HANGUP
from llmtrain.rundir.job_record import read_launches
from llmtrain.jobs.slurm_query import SlurmJob, query
from llmtrain.launch.backends.traits import known_traits
from llmtrain.launch.supervision.failures import errored_ranks, rank_statuses, read_only, stopped_short
from llmtrain.launch.supervision.placement import describe_rank
from llmtrain.launch.run_lock import holder_gone
from llmtrain.rundir.paths import RunPaths

RUNNING, PENDING, UNKNOWN = "running", "pending", "unknown"
FINISHED, FAILED, INTERRUPTED, PREEMPTED = "finished", "failed", "interrupted", "preempted"
STOPPED = "stopped"  # ended well at train.stop_at_step, short of train.max_steps
HUNG_UP = "hung up"  # its launcher got SIGHUP (a closed terminal): the workers checkpointed, as on preemption
LAUNCHER_INTERRUPTED, LAUNCHER_PREEMPTED = 130, 143


@dataclass
class JobState:
    state: str
    reason: str
    holder: dict = field(default_factory=dict)  # the live lock holder; {} once the job has ended
    launch: dict = field(default_factory=dict)  # the newest launch's record; {} when there is none
    slurm: SlurmJob | None = None

    @property
    def live(self) -> bool:
        return bool(self.holder)

    @property
    def job_id(self) -> str | None:
        return self.holder.get("job") or self.launch.get("job_id")


def read_holder(run_dir: str) -> dict:
    """RUN_DIR/.lock's holder; {} when the lock is free. An unreadable lock names a holder that is gone."""
    try:
        with open(RunPaths(run_dir).lock) as f:
            holder = json.load(f)
    except FileNotFoundError:
        return {}
    except (OSError, ValueError):
        return {"host": "?", "pid": -1}
    return holder if isinstance(holder, dict) else {"host": "?", "pid": -1}


def launcher_owned(backend: str | None) -> bool:
    """Whether the launcher of a launch recorded with this backend owned the job's processes, so that how it exited
    is how the job ended; a name this llmtrain does not know (an old record) is not."""
    traits = known_traits(backend)
    return traits is not None and traits.owns_processes


def describe_launcher(holder: dict) -> str:
    return f"launcher pid {holder.get('pid')} on {holder.get('host')}"


def job_state(run_dir: str) -> JobState:
    launches = read_launches(run_dir)
    holder = read_holder(run_dir)
    launch = _current_launch(launches, holder)
    job_id = holder.get("job") or launch.get("job_id")
    slurm = query(job_id) if job_id else None
    if holder:
        live = _live(holder, slurm)
        if live is not None:
            live.launch = launch
            return live
    state, reason = _ended(run_dir, launch, slurm)
    return JobState(state, reason, {}, launch, slurm)


def _current_launch(launches: list[dict], holder: dict) -> dict:
    """The newest launch's record; {} while a new launcher holds the lock and has not recorded its launch yet
    (it is still checking the resume and preparing the data)."""
    newest = launches[-1] if launches else {}
    launcher = newest.get("launcher", {})
    if holder.get("pid") and not holder.get("job") and (launcher.get("pid"), launcher.get("host")) != \
            (holder.get("pid"), holder.get("host")):
        return {}
    return newest


def _live(holder: dict, slurm: SlurmJob | None) -> JobState | None:
    """The state of a job whose holder still runs; None when the holder is gone."""
    if holder.get("job"):
        job = holder["job"]
        if slurm is None:
            return JobState(UNKNOWN, f"Slurm job {job} holds the run directory, and scontrol is not here to ask "
                                     "about it", holder)
        if slurm.ended:
            return None
        why = f" ({slurm.reason})" if slurm.reason else ""
        if slurm.restarts:  # a requeued job waits again (BeginTime), then resumes from its newest checkpoint
            why += f", requeued (restart {slurm.restarts})"
        return JobState(PENDING if slurm.pending else RUNNING, f"Slurm job {job} {slurm.state}{why}", holder, {},
                        slurm)
    if holder_gone(holder) is not None:
        return None
    return JobState(RUNNING, f"{describe_launcher(holder)}, since {holder.get('started', '?')}", holder, {}, slurm)


def _ended(run_dir: str, launch: dict, slurm: SlurmJob | None) -> tuple[str, str]:
    """(state, reason) of a job that no longer runs."""
    statuses = rank_statuses(run_dir)
    owned = launcher_owned(launch.get("backend"))
    code = launch.get("exit_code") if owned else None
    errors = errored_ranks(statuses)
    preempted = {r: s for r, s in statuses.items() if s.get("status") == "preempted"}
    if code == LAUNCHER_INTERRUPTED:
        return INTERRUPTED, "stopped by Ctrl-C or llmtrain cancel --now (the launcher exited 130)"
    if code == EXIT_HANGUP:
        return HUNG_UP, _hangup_reason(preempted)
    if launch.get("hang"):  # the launcher's verdict (launch/supervision/hang_verdict.py): its peers' errors follow
        return FAILED, launch["hang"].removeprefix("llmtrain: ")
    if launch.get("not_requeued") and not preempted:  # the Slurm job stopped itself (launch/node/slurm_requeue.py)
        return FAILED, f"not requeued: {launch['not_requeued']}"
    if errors:
        error = (statuses[errors[0]].get("error") or "").strip().splitlines()
        return FAILED, f"{describe_rank(run_dir, errors[0])} failed" + (f": {error[0]}" if error else "")
    if owned and launch.get("ended") is None:
        if read_only(run_dir):  # the launcher could not record its end: not a sign that it was killed
            return FAILED, read_only(run_dir)
        return INTERRUPTED, "its launcher ended without recording how (it was killed)"
    if preempted or code == LAUNCHER_PREEMPTED or (slurm and slurm.state == "PREEMPTED"):
        return PREEMPTED, _preempted_reason(preempted)
    if statuses and all(s.get("status") == "ok" for s in statuses.values()):
        short = stopped_short(statuses)
        return (STOPPED, short) if short else (FINISHED, f"all {len(statuses)} rank(s) finished")
    if slurm is not None and slurm.state == "CANCELLED":
        return INTERRUPTED, f"Slurm job {slurm.job_id} was cancelled"
    if slurm is not None and slurm.ended:
        return FAILED, f"Slurm job {slurm.job_id} ended {slurm.state} before its ranks recorded how they ended"
    if code not in (None, 0):
        return FAILED, f"the launcher exited {code}"
    if launch and launch.get("exit_code") is None and launch.get("ended"):
        return FAILED, "the launcher stopped with an error before the job ran"
    return FAILED, "no rank recorded how it ended (see logs/)"


def _hangup_reason(preempted: dict[int, dict]) -> str:
    said = "stopped by SIGHUP (its terminal closed; the launcher exited 129)"
    if not preempted:
        return said + " before the ranks recorded a checkpoint"
    return f"{said}; {_preempted_reason(preempted)}; the same command resumes"


def _preempted_reason(preempted: dict[int, dict]) -> str:
    if not preempted:
        return "the launcher was preempted (exit 143) before the ranks recorded a checkpoint"
    step = max(s.get("step") or 0 for s in preempted.values())
    saved = all(s.get("saved", True) for s in preempted.values())
    return f"stopped at step {step}; " + ("checkpoint saved" if saved else "no checkpoint saved (non-finite state)")
