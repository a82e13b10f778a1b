"""Every file and folder of a run directory, named in one place. The layout (docs/guarantees.md, "Run directory"):

    RUN_DIR/
      config.yaml                 the resolved config the workers read (frozen at launch)
      metrics.jsonl               one JSON object per logged step and per eval (rundir.metrics_file)
      logs/rank{R}.log            every rank's stdout/stderr
      logs/rank{R}.status         how the rank ended (rundir.rank_files)
      logs/rank{R}.place          the rank's node, host, local rank and pid, written as it starts (rundir.rank_files)
      logs/rank{R}.progress       the rank's heartbeat: the step it last completed (rundir.hang_files)
      logs/node{N}.log            the torchrun agent's output on node N
      logs/node{N}.env            the effective NCCL_*/GLOO_*/CUDA_* environment on node N
      logs/combined.log           every rank's log, interleaved by time
      logs/slurm-{JOB}.out        the Slurm job's own output (cluster=slurm)
      .lock                       the job that holds this run directory while it runs
      job.json                    every launch into this directory (rundir.job_record)
      nodes.json                  per host: failures, hangs, stragglers, across launches (rundir.node_ledger)
      hangs/<time>/               a hang's evidence and verdict: stacks, collective traces, log tails (rundir.hang_files)
      goodput.json                per start: allocated time split into productive, queue, start-up, saves, lost work, restarts (rundir.goodput)
      spikes.json                 every loss-spike rollback of the run: the spike, the checkpoint, the skipped samples (rundir.spike_record)
      previous/<time>/            earlier runs moved aside by run.overwrite=true
      checkpoints/step-NNNNNNN/   DCP shards, config.yaml, meta.json (llmtrain.checkpoint.store)
      slurm/job.sbatch            the submitted script (cluster=slurm)
      tensorboard/                event files (logging.tensorboard=true)
      trackers.json               the W&B and MLflow run ids of this run
      wandb/                      W&B's files (logging.wandb=true)
      mlflow.db                   the local MLflow store (logging.mlflow=true without a tracking URI)
      profile/                    torch.profiler traces per rank, nsys reports
      report/                     llmtrain report's plots
      tmp/                        the workers' TMPDIR (cluster=local)
"""

from __future__ import annotations

import os
from dataclasses import dataclass

CONFIG = "config.yaml"
METRICS = "metrics.jsonl"
LOGS = "logs"
LOCK = ".lock"
JOB_RECORD = "job.json"
NODES = "nodes.json"
HANGS = "hangs"
GOODPUT = "goodput.json"
SPIKES = "spikes.json"
PREVIOUS = "previous"
CHECKPOINTS = "checkpoints"
SLURM = "slurm"
TENSORBOARD = "tensorboard"
TRACKERS = "trackers.json"
WANDB = "wandb"
MLFLOW_DB = "mlflow.db"
PROFILE = "profile"
REPORT = "report"
TMP = "tmp"
COMBINED_LOG = "combined.log"
STATUS_SUFFIX = ".status"
PLACE_SUFFIX = ".place"

# What a run leaves in its directory besides checkpoints (and the launch's .lock and job.json): what
# run.overwrite=true moves aside with them.
RUN_FILES = (CONFIG, METRICS, LOGS, TENSORBOARD, REPORT, PROFILE, SLURM, TRACKERS, WANDB, MLFLOW_DB, SPIKES)


@dataclass(frozen=True)
class RunPaths:
    """The paths of one run directory: `RunPaths(run_dir).metrics`, `.rank_status(3)`."""

    run_dir: str

    def _join(self, *parts: str) -> str:
        return os.path.join(self.run_dir, *parts)

    @property
    def config(self) -> str:
        return self._join(CONFIG)

    @property
    def metrics(self) -> str:
        return self._join(METRICS)

    @property
    def logs(self) -> str:
        return self._join(LOGS)

    @property
    def lock(self) -> str:
        return self._join(LOCK)

    @property
    def job_record(self) -> str:
        return self._join(JOB_RECORD)

    @property
    def previous(self) -> str:
        return self._join(PREVIOUS)

    @property
    def checkpoints(self) -> str:
        return self._join(CHECKPOINTS)

    @property
    def sbatch_script(self) -> str:
        return self._join(SLURM, "job.sbatch")

    @property
    def tensorboard(self) -> str:
        return self._join(TENSORBOARD)

    @property
    def trackers(self) -> str:
        return self._join(TRACKERS)

    @property
    def wandb(self) -> str:
        return self._join(WANDB)

    @property
    def mlflow_db(self) -> str:
        return self._join(MLFLOW_DB)

    @property
    def profile(self) -> str:
        return self._join(PROFILE)

    @property
    def report(self) -> str:
        return self._join(REPORT)

    @property
    def nodes(self) -> str:
        return self._join(NODES)

    @property
    def goodput(self) -> str:
        return self._join(GOODPUT)

    @property
    def spikes(self) -> str:
        return self._join(SPIKES)

    @property
    def goodput_events(self) -> str:
        """Rank 0's timeline of the current start (steps, saves, restarts), for the goodput ledger."""
        return self._join(LOGS, "goodput-events.jsonl")

    @property
    def goodput_start(self) -> str:
        """A Slurm start's wall-clock beginning and queue wait, read at its end."""
        return self._join(LOGS, "goodput-start.json")

    @property
    def hangs(self) -> str:
        return self._join(HANGS)

    @property
    def hang_request(self) -> str:
        return self._join(HANGS, "request")

    @property
    def tmp(self) -> str:
        return self._join(TMP)

    @property
    def combined_log(self) -> str:
        return self._join(LOGS, COMBINED_LOG)

    def rank_log(self, rank: int | str) -> str:
        """`rank` may be a glob pattern ("*")."""
        return self._join(LOGS, f"rank{rank}.log")

    def rank_status(self, rank: int | str) -> str:
        return self._join(LOGS, f"rank{rank}{STATUS_SUFFIX}")

    def rank_place(self, rank: int | str) -> str:
        return self._join(LOGS, f"rank{rank}{PLACE_SUFFIX}")

    def rank_progress(self, rank: int | str) -> str:
        return self._join(LOGS, f"rank{rank}.progress")

    def rank_stacks(self, rank: int | str) -> str:
        """Where the rank's faulthandler writes its stacks on a hang's request."""
        return self._join(LOGS, f"rank{rank}.stacks")

    def rank_exit_trace(self, rank: int | str) -> str:
        """The collective trace a failing rank writes as it exits."""
        return self._join(LOGS, f"rank{rank}.collectives.json")

    def rank_reserve(self, rank: int | str) -> str:
        """Room the rank keeps aside for its status on a disk that fills up (rundir.space_reserve)."""
        return self._join(LOGS, f"rank{rank}.reserve")

    @property
    def launcher_reserve(self) -> str:
        """Room the launcher keeps aside for job.json's exit code on a disk that fills up (rundir.space_reserve)."""
        return self._join(LOGS, "launcher.reserve")

    def node_log(self, node: int | str) -> str:
        """`node` may be a glob pattern ("*")."""
        return self._join(LOGS, f"node{node}.log")

    def node_env(self, node: int | str) -> str:
        return self._join(LOGS, f"node{node}.env")

    def slurm_output(self, job_id: str) -> str:
        """`job_id` may be Slurm's own pattern ("%j")."""
        return self._join(LOGS, f"slurm-{job_id}.out")
