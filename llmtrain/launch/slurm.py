"""cluster=slurm: render an sbatch script from the config, submit it, and optionally follow the job.

The script runs one task per node (`srun`), each a node agent around torchrun with a c10d rendezvous on the job's
first node. `--signal=USR1@N` gives the workers N seconds' notice before the time limit, `--requeue` lets Slurm
restart a preempted job, and `checkpoint.resume=auto` makes the restarted job continue from its newest checkpoint.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess

from llmtrain.config.errors import ConfigError
from llmtrain.launch.backend import Backend, NodeCommand, node_python, torchrun_argv, worker_env
from llmtrain.launch.failures import report_failure

FINAL_STATES = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL",
                "DEADLINE", "PREEMPTED"}


class SlurmBackend(Backend):
    name = "slurm"
    owns_processes = False

    def __init__(self, cfg, run_dir, worker_module="llmtrain.worker"):
        super().__init__(cfg, run_dir, worker_module)
        self.job_id: str | None = None
        self.workdir = cfg.cluster.workdir or os.getcwd()

    def script(self) -> str:
        c, cfg = self.cfg.cluster, self.cfg
        name = c.job_name or f"llmtrain-{cfg.run.name}"
        lines = ["#!/bin/bash", f"#SBATCH --job-name={name}", f"#SBATCH --nodes={c.nnodes}",
                 "#SBATCH --ntasks-per-node=1",
                 f"#SBATCH --output={os.path.join(self.run_dir, 'logs', 'slurm-%j.out')}",
                 "#SBATCH --open-mode=append", f"#SBATCH --signal=USR1@{c.signal_before_end_s}"]
        for option, value in (("partition", c.partition), ("account", c.account), ("time", c.time),
                              ("cpus-per-task", c.cpus_per_node)):
            if value:
                lines.append(f"#SBATCH --{option}={value}")
        if self.gpus_per_node():
            lines.append(f"#SBATCH --gpus-per-node={self.gpus_per_node()}")
        if c.requeue:
            lines.append("#SBATCH --requeue")
        lines += [f"#SBATCH {extra}" for extra in c.sbatch_extra]
        env = worker_env(cfg)
        env["LLMTRAIN_AGENT_WATCH_STDIN"] = "0"  # srun gives tasks no stdin to watch
        port = str(c.master_port) if c.master_port else "$((20000 + SLURM_JOB_ID % 20000))"
        # These two arguments are expanded by the job's shell; every other one is quoted.
        endpoint, rdzv_id = "--rdzv-endpoint=${head}:${port}", "--rdzv-id=llmtrain-${SLURM_JOB_ID}"
        torchrun = torchrun_argv(cfg, self.run_dir, c.nnodes, None, "${head}:${port}", "llmtrain-${SLURM_JOB_ID}",
                                 self.worker_module)
        agent = [node_python(cfg), "-m", "llmtrain.launch.node_agent", self.run_dir, "slurm", "--", *torchrun]
        command = " ".join(f'"{a}"' if a in (endpoint, rdzv_id) else shlex.quote(a) for a in agent)
        lines += ["set -euo pipefail", f"cd {shlex.quote(self.workdir)}"]
        lines += [f"export {k}={shlex.quote(v)}" for k, v in sorted(env.items())]
        lines += ['head=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)', f"port={port}",
                  'echo "llmtrain: job $SLURM_JOB_ID on $SLURM_JOB_NODELIST (restart ${SLURM_RESTART_COUNT:-0})"',
                  f"srun --nodes={c.nnodes} --ntasks-per-node=1 --kill-on-bad-exit=1 {command}"]
        return "\n".join(lines) + "\n"

    def gpus_per_node(self) -> int:
        """cluster.gpus_per_node, else one GPU per process (none for a CPU job)."""
        c = self.cfg.cluster
        if c.gpus_per_node is not None:
            return c.gpus_per_node
        return 0 if self.cfg.device == "cpu" else c.nproc_per_node

    def check_ready(self) -> None:
        import shutil

        for tool in ("sbatch", "scontrol"):
            if shutil.which(tool) is None:
                raise ConfigError("cluster.name", f"cluster=slurm but {tool} is not on PATH on this node (launch "
                                                  "from a Slurm login node, or use cluster=local|ssh)")

    def job_holding_run_dir(self) -> str | None:
        if self.job_id is None:
            return None
        state = self.job_state()[0]
        return None if state in FINAL_STATES or state == "UNKNOWN" else self.job_id

    def preview(self) -> str:
        return f"sbatch script ({self.script_path()}), submitted with sbatch --parsable:\n{self.script()}"

    def script_path(self) -> str:
        return os.path.join(self.run_dir, "slurm", "job.sbatch")

    def node_commands(self) -> list[NodeCommand]:
        return [NodeCommand(host="sbatch", node_rank=0, argv=["sbatch", "--parsable", self.script_path()])]

    def submit(self) -> str:
        path = self.script_path()
        os.makedirs(os.path.dirname(path), exist_ok=True)
        tmp = path + ".tmp"
        with open(tmp, "w") as f:
            f.write(self.script())
        os.replace(tmp, path)
        try:
            out = subprocess.run(["sbatch", "--parsable", path], capture_output=True, text=True, timeout=60)
        except FileNotFoundError:
            raise ConfigError("cluster.name", "cluster=slurm but sbatch is not on PATH on this node") from None
        if out.returncode != 0:
            raise ConfigError("cluster", f"sbatch refused the job: {out.stderr.strip().splitlines()[-1:]}")
        self.job_id = out.stdout.strip().split(";")[0]
        return self.job_id

    def job_state(self) -> tuple[str, int | None]:
        """(state, exit code) from scontrol; ("UNKNOWN", None) once the job has left the controller."""
        out = subprocess.run(["scontrol", "show", "job", self.job_id], capture_output=True, text=True, timeout=30)
        state = re.search(r"JobState=(\S+)", out.stdout)
        code = re.search(r"ExitCode=(\d+):(\d+)", out.stdout)
        exit_code = None
        if code:
            exit_code = int(code.group(1)) or (128 + int(code.group(2)) if int(code.group(2)) else 0)
        return (state.group(1) if state else "UNKNOWN"), exit_code

    def run(self, monitor) -> int:
        job = self.submit()
        monitor.console.print(f"llmtrain: submitted Slurm job {job} ({self.script_path()})", markup=False,
                              highlight=False)
        if not self.cfg.cluster.follow:
            monitor.console.print(f"llmtrain: follow it with: squeue -j {job}; logs in "
                                  f"{os.path.join(self.run_dir, 'logs')}", markup=False, highlight=False)
            return 0
        code = self.follow(monitor)
        code = 1 if code is None else code
        if code != 0:
            # srun gathers every node's torchrun output into the job's log; ranks are global there.
            report_failure(monitor.console, self.run_dir, self.job_output(), code)
        return code

    def job_output(self) -> str:
        try:
            with open(os.path.join(self.run_dir, "logs", f"slurm-{self.job_id}.out"), errors="replace") as f:
                return f.read()
        except FileNotFoundError:
            return ""

    def follow(self, monitor, timeout_s: float | None = None) -> int | None:
        last = [None]

        def poll() -> int | None:
            state, code = self.job_state()
            if state != last[0]:
                monitor.console.print(f"llmtrain: job {self.job_id} {state}", markup=False, highlight=False)
                last[0] = state
            if state in FINAL_STATES or state == "UNKNOWN":
                return 0 if state == "COMPLETED" else (code or 1)
            return None

        return monitor.follow(poll, interval_s=2.0, timeout_s=timeout_s)

    def signal_workers(self, sig: int) -> int:
        if self.job_id:
            subprocess.run(["scancel", "--signal=USR1", "--full", self.job_id], capture_output=True, timeout=30)
            return 1
        return 0

    def stop(self) -> None:
        """A submitted job belongs to Slurm: stopping the launcher only stops following it (scancel ends it)."""
