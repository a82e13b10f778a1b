"""cluster=slurm: render an sbatch script from the config, submit it, and optionally follow the job.

The script runs one task per node (`srun`), each a node agent around torchrun with a c10d rendezvous on the job's
first node, on a port of its own (20000 + job id % 20000 unless cluster.master_port is set) so jobs sharing a node
never share a rendezvous. The job itself gives the workers cluster.signal_before_end_s seconds' notice (USR1) before
its time limit (slurm_notice.py; Slurm's own --signal resends it at once to a requeued job, which then stops
again before it trains), `--requeue` lets Slurm restart a preempted job, and `checkpoint.resume=auto` makes the
restarted job continue from its newest checkpoint; a run that accepts fewer nodes is pinned to the healthy ones at
each start (shape/slurm_node_count.py). A USR1 to the batch shell (`--signal=B:USR1@N`, `scancel --batch`) is a preemption notice, passed on
to the steps (sbatch_lines.py). The job takes the run directory's lock itself when it starts (slurm_job_start.py),
so a second submission of the same script refuses to run beside the first. The job watches itself for hangs,
followed or not (slurm_hang_watch.py); a follower shows its verdict and runs no hang detection of its own.

A submitted job belongs to Slurm: the launcher only submits it, and with cluster.follow follows it. Ctrl-C stops
following and leaves the job running; a job Slurm will never start (NEVER_STARTS) is cancelled with its reason.
Every Slurm command goes through llmtrain.slurm.client, with a timeout: a slow controller delays the follower,
it never hangs it.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess

from llmtrain.config.errors import ConfigError
from llmtrain.console import say
from llmtrain.launch.backends.base import Backend, NodeCommand, node_python, torchrun_argv, worker_env
from llmtrain.launch.backends.traits import traits_of
from llmtrain.launch.container import host_python, in_container, setup_outside, srun_options
from llmtrain.launch.supervision.failures import rank_statuses, report_failure
from llmtrain.launch.supervision.line_follower import LineFollower
from llmtrain.launch.node.env import wrap_for_gloo
from llmtrain.launch.node.slurm_hang_watch import HUNG
from llmtrain.launch.node.start_culprits import SETUP_BEGINS
from llmtrain.launch.node.setup import setup_statements
from llmtrain.launch.shape.check import elastic
from llmtrain.launch.shape.slurm_node_count import release_pinned
from llmtrain.launch.backends.sbatch_lines import (NOTICE_TRAP, node_options, output_path, sbatch_quoted,
                                                    shell_words, start_nodes)
from llmtrain.slurm.node_states import partition_cpus
from llmtrain.launch.backends.slurm_refusals import (NEVER_STARTS, NODE_COUNT_REASONS, REQUEST_KEYS, never_starts,
                                                     refusal_key, shown)
from llmtrain.slurm import client
from llmtrain.slurm.job_states import ENDED_STATES, FINAL_STATES, NOT_STARTED_STATES, exit_code
from llmtrain.rundir.atomic import atomic_write_text
from llmtrain.rundir.paths import STATUS_SUFFIX, RunPaths

SLURM_TIMEOUT_S = 20
SBATCH_TIMEOUT_S = 60
# The rendezvous port of a job without cluster.master_port, as the script computes it.
PORT_BASE, PORT_SPAN = 20000, 20000
EXIT_DETACHED = 0  # Ctrl-C: the launcher stopped following and the job runs on, as `llmtrain follow` exits
EXIT_NEVER_STARTS = 1
EXIT_INTERRUPTED = 130
EXIT_UNFINISHED = 143  # stopped on a signal with a checkpoint, like a preempted local launch


class _Seen:
    """What the follower has said so far, so it speaks only of changes."""

    def __init__(self):
        self.state: str | None = None
        self.reason: str | None = None
        self.restarts = 0
        self.job_log: LineFollower | None = None


class SlurmBackend(Backend):
    traits = traits_of("slurm")

    def __init__(self, cfg, run_dir, worker_module="llmtrain.worker"):
        super().__init__(cfg, run_dir, worker_module)
        self.job_id: str | None = None
        self.workdir = cfg.cluster.workdir or os.getcwd()
        # Whether run() returned because the job ended (not because it was submitted, left, or never started):
        # only then is "job finished" true.
        self.finished_job = False
        # Whether it ended unfinished (stopped on a signal, with a checkpoint): not a failure to report. A flag, not
        # the exit code: srun's own status can be 143 too.
        self.unfinished = False
        self.console = None
        self._cpus: tuple[int, str] | None = None
        # Called with the job id as soon as sbatch gives it (the run directory's lock names the job).
        self.on_submitted = None
        # Whether the job's newest start was stopped by its hang watch (its verdict is said: no failure report).
        self.hung = False

    # ---------------------------------------------------------------------------------------------- the script
    def script(self) -> str:
        c = self.cfg.cluster
        python = shlex.quote(host_python(self.cfg))
        run_dir = shlex.quote(self.run_dir)
        lines = ["#!/bin/bash", *self._sbatch_options(), "set -euo pipefail", *NOTICE_TRAP,
                 f"cd {shlex.quote(self.workdir)}"]
        lines += self._setup_lines()
        env = worker_env(self.cfg)
        env["LLMTRAIN_AGENT_WATCH_STDIN"] = "0"  # srun gives tasks no stdin to watch
        lines += [f"export {k}={shlex.quote(v)}" for k, v in sorted(env.items())]
        # One job per run directory, however this script was submitted (slurm_job_start.py).
        lines.append(f"{python} -m llmtrain.launch.node.slurm_job_start {run_dir}")
        port = str(c.master_port) if c.master_port else f"$(({PORT_BASE} + SLURM_JOB_ID % {PORT_SPAN}))"
        lines += ['head=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)', f"port={port}",
                  'echo "llmtrain: job $SLURM_JOB_ID on $SLURM_JOB_NODELIST, rendezvous ${head}:${port} '
                  '(restart ${SLURM_RESTART_COUNT:-0})"',
                  # Rank statuses tell how this start of the job ended, and heartbeats whether it hangs: a
                  # requeued job's earlier ones go.
                  f"rm -f {shlex.quote(RunPaths(self.run_dir).logs)}/rank*{STATUS_SUFFIX} "
                  f"{shlex.quote(RunPaths(self.run_dir).logs)}/rank*.progress",
                  # Every rank's log in one file with [node/rank] prefixes, while srun runs (combined_log.py).
                  f"{python} -m llmtrain.launch.supervision.combined_log {run_dir} & merger=$!",
                  # The time-limit notice, from the job itself (slurm_notice.py).
                  f'{python} -m llmtrain.launch.node.slurm_notice "$SLURM_JOB_ID" {c.signal_before_end_s} & notice=$!',
                  # The job's own hang watch, followed or not: it ends the steps of a hung job (slurm_hang_watch.py).
                  f"{python} -m llmtrain.launch.node.slurm_hang_watch {run_dir} {start_nodes(self.cfg)} "
                  f"{c.nproc_per_node} "
                  f"{self.cfg.launch.hang_timeout_s:g} {self.cfg.launch.hang_evidence_wait_s:g} & hangwatch=$!",
                  "set +e",
                  # In the background, so that the trap runs when a notice comes (bash runs traps between commands).
                  f"{shell_words(self._srun_argv())} {self._node_command(env)} & step=$!",
                  'step_status "$step"; code=$?',
                  'kill "$notice" 2>/dev/null; kill -TERM "$merger"; wait "$merger"',
                  # The job's end ignores a USR1, as the shell did (it would kill Python).
                  "trap '' USR1",
                  'kill -TERM "$hangwatch" 2>/dev/null; wait "$hangwatch"; hung=$?',
                  # Finished, hung, or cut short by the time limit or a notice: then the job requeues itself
                  # (slurm_job_end.py).
                  f"LLMTRAIN_HANG_WATCH=\"$hung\" exec {python} -m llmtrain.launch.node.slurm_job_end "
                  f"{run_dir} \"$code\" {c.signal_before_end_s} {int(bool(c.requeue))} \"$noticed\""]
        return "\n".join(lines) + "\n"

    def _sbatch_options(self) -> list[str]:
        c = self.cfg.cluster
        lines = [f"#SBATCH --job-name={sbatch_quoted(self._job_name(), 'cluster.job_name')}",
                 *node_options(self.cfg), "#SBATCH --ntasks-per-node=1",
                 f"#SBATCH --cpus-per-task={self.cpus_per_task()[0]}",
                 f"#SBATCH --output={output_path(self.run_dir)}",
                 "#SBATCH --open-mode=append"]
        for option, value in (("partition", c.partition), ("account", c.account), ("time", c.time)):
            if value:
                lines.append(f"#SBATCH --{option}={value}")
        if self.gpus_per_node():
            lines.append(f"#SBATCH --gpus-per-node={self.gpus_per_node()}")
        if c.exclude:  # ',' or '@' between names, as for cluster=ssh
            names = ",".join(n.strip() for n in re.split(r"[,@]", c.exclude) if n.strip())
            lines.append(f"#SBATCH --exclude={sbatch_quoted(names, 'cluster.exclude')}")
        if c.requeue:
            lines.append("#SBATCH --requeue")
        return lines + [f"#SBATCH {extra}" for extra in c.sbatch_extra]

    def _setup_lines(self) -> list[str]:
        """cluster.setup, in the batch shell before srun: the tasks srun starts inherit what it exports (with a
        container, the lines run inside it instead)."""
        if not setup_outside(self.cfg):
            return []
        # A failing line ends the start like a failed step: recorded against this node (or those where srun says
        # the line's tasks failed), maybe requeued.
        end = (f"LLMTRAIN_SETUP_FAILED=1 exec {shlex.quote(host_python(self.cfg))} -m llmtrain.launch.node."
               f"slurm_job_end {shlex.quote(self.run_dir)} \"$code\" {self.cfg.cluster.signal_before_end_s} "
               f"{int(bool(self.cfg.cluster.requeue))} 0")
        # Where this start's set-up begins in the job's log: a failure is blamed on the nodes srun names after it.
        begins = (f'echo "{SETUP_BEGINS}$(hostname) (job ${{SLURM_JOB_ID:-?}}, restart '
                  '${SLURM_RESTART_COUNT:-0})"')
        return [f"trap {shlex.quote('code=$?; ' + end)} EXIT", begins,
                "set +u  # set-up scripts (module, conda, venv activate) may read unset variables",
                *setup_statements(setup_outside(self.cfg)), "set -u", "trap - EXIT"]

    def _srun_argv(self) -> list[str]:
        """srun with one task per node and the job's CPUs for it (said again: some Slurm versions do not pass
        sbatch's --cpus-per-task on to srun), and pyxis's container options when the tasks run in an image."""
        return ["srun", f"--nodes={start_nodes(self.cfg)}", "--ntasks-per-node=1",
                f"--cpus-per-task={self.cpus_per_task()[0]}", "--kill-on-bad-exit=1",
                *srun_options(self.cfg, self.workdir, self.run_dir)]

    def cpus_per_task(self) -> tuple[int, str]:
        """CPUs for each node's one task (the node agent, torchrun and every worker of the node), and where the
        number comes from: cluster.cpus_per_node, else the partition's CPUs per node (sinfo), else one per
        process."""
        c = self.cfg.cluster
        if self._cpus is None and c.cpus_per_node:
            self._cpus = (c.cpus_per_node, "cluster.cpus_per_node")
        elif self._cpus is None:
            found = partition_cpus(c.partition)
            if found:
                where = f"partition {c.partition}" if c.partition else "the default partition"
                self._cpus = (found, f"every node of {where} has {found} (sinfo); cluster.cpus_per_node sets it")
            else:
                self._cpus = (c.nproc_per_node, "one per process: sinfo could not tell the partition's CPUs per "
                                                "node; cluster.cpus_per_node sets it")
        return self._cpus

    def _node_command(self, env: dict[str, str]) -> str:
        """The node agent + torchrun (in the container, if any) as shell text the job's shell expands."""
        cfg = self.cfg
        torchrun = torchrun_argv(cfg, self.run_dir, start_nodes(self.cfg), None, "${head}:${port}",
                                 "llmtrain-${SLURM_JOB_ID}", self.worker_module)
        agent = [node_python(cfg), "-m", "llmtrain.launch.node.agent", self.run_dir, "slurm", "--", *torchrun]
        agent = in_container(cfg, wrap_for_gloo(agent, env, node_python(cfg)), env, self.workdir, self.run_dir)
        return shell_words(agent)

    def gpus_per_node(self) -> int:
        """cluster.gpus_per_node, else one GPU per process (none for a CPU job)."""
        c = self.cfg.cluster
        if c.gpus_per_node is not None:
            return c.gpus_per_node
        return 0 if self.cfg.device == "cpu" else c.nproc_per_node

    def rendezvous_port(self) -> str:
        c = self.cfg.cluster
        if c.master_port:
            return str(c.master_port)
        if self.job_id and self.job_id.isdigit():
            return str(PORT_BASE + int(self.job_id) % PORT_SPAN)
        return f"{PORT_BASE} + job id % {PORT_SPAN}"

    # ------------------------------------------------------------------------------------------ the interface
    def check_ready(self) -> None:
        import shutil

        # A run.dir or job name an #SBATCH line cannot carry: refused before anything is written.
        output_path(self.run_dir)
        sbatch_quoted(self._job_name(), "cluster.job_name")

        for tool in ("sbatch", "scontrol"):
            if shutil.which(tool) is None:
                raise ConfigError("cluster.name", f"cluster=slurm but {tool} is not on PATH on this node (launch "
                                                  "from a Slurm login node, or use cluster=local|ssh)")

    def job_holding_run_dir(self) -> str | None:
        if self.job_id is None:
            return None
        job = self.job_info()
        if job is None:  # scontrol did not answer: the job may well run on
            return self.job_id
        state = job.get("JobState", "UNKNOWN")
        return None if state in ENDED_STATES else self.job_id

    def preview(self) -> str:
        cpus, why = self.cpus_per_task()
        return (f"sbatch script ({self.script_path()}), submitted with sbatch --parsable; --cpus-per-task={cpus}: "
                f"{why}\n{self.script()}")

    def script_path(self) -> str:
        return RunPaths(self.run_dir).sbatch_script

    def node_commands(self) -> list[NodeCommand]:
        return [NodeCommand(host="sbatch", node_rank=0, argv=["sbatch", "--parsable", self.script_path()])]

    # ------------------------------------------------------------------------------------------ submitting
    def submit(self) -> str:
        path = self.script_path()
        os.makedirs(os.path.dirname(path), exist_ok=True)
        atomic_write_text(path, self.script())
        try:
            out = client.submit(path, SBATCH_TIMEOUT_S, hold=elastic(self.cfg))
        except FileNotFoundError:
            raise ConfigError("cluster.name", "cluster=slurm but sbatch is not on PATH on this node") from None
        except subprocess.TimeoutExpired:
            raise ConfigError("cluster", f"sbatch did not answer within {SBATCH_TIMEOUT_S} s; squeue -u $USER shows "
                                         "whether the job was submitted") from None
        if out.returncode != 0:
            raise self.refusal(out.stderr or out.stdout)
        self.job_id = out.stdout.strip().split(";")[0]
        if elastic(self.cfg):  # held: its first start asks for the healthy nodes, then it is let go
            release_pinned(self.job_id, self.cfg)
        if self.on_submitted is not None:
            self.on_submitted(self.job_id)
        return self.job_id

    def refusal(self, stderr: str) -> ConfigError:
        """sbatch's refusal as an error naming the config key behind it, with sbatch's own words."""
        lines = [ln.strip() for ln in stderr.strip().splitlines() if ln.strip()]
        said = "; ".join(lines[-2:]) or "no message"
        key = refusal_key(stderr)
        if key is None:  # not about what the config asks for: sbatch's words, and the script it read
            return ConfigError("cluster", f"sbatch refused the job script {self.script_path()}: {said}")
        keys = REQUEST_KEYS if key == "cluster" else (key,)
        asked = ", ".join(f"{k}={shown(self._requested(k))}" for k in keys)
        return ConfigError(key, f"sbatch refused the job ({asked}): {said}")

    def _requested(self, key: str):
        if key == "cluster.gpus_per_node":
            return self.gpus_per_node()
        if key == "cluster.cpus_per_node":
            return self.cpus_per_task()[0]
        return self.cfg.cluster[key.split(".", 1)[1]]

    # ------------------------------------------------------------------------------------------ following
    def run(self, monitor) -> int:
        self.console = monitor.console
        try:
            job = self.submit()
        except KeyboardInterrupt:
            say(f"interrupted while submitting; squeue -u $USER -n {self._job_name()} shows whether Slurm "
                "got the job", console=self.console)
            return EXIT_INTERRUPTED
        say(f"submitted Slurm job {job} ({self.script_path()}); rendezvous on the job's first node, port "
            f"{self.rendezvous_port()}", console=self.console)
        if not self.cfg.cluster.follow:
            say(f"follow it: squeue -j {job}, or llmtrain follow {self.run_dir} (logs in "
                f"{RunPaths(self.run_dir).logs})", console=self.console)
            say(f"cancel it: scancel {job}, or llmtrain cancel {self.run_dir}", console=self.console)
            return 0
        try:
            code = self.follow(monitor)
        except KeyboardInterrupt:
            say(f"stopped following job {job}; it keeps running (llmtrain cancel {self.run_dir} or scancel "
                f"{job} to stop it)", console=self.console)
            return EXIT_DETACHED
        code = 1 if code is None else code
        if code != 0 and self.finished_job and not self.unfinished and not self.hung:
            # srun gathers every node's torchrun output into the job's log; ranks are global there.
            report_failure(monitor.console, self.run_dir, self.job_output(), code)
        return code

    def _job_name(self) -> str:
        return self.cfg.cluster.job_name or f"llmtrain-{self.cfg.run.name}"

    def job_output(self) -> str:
        try:
            with open(RunPaths(self.run_dir).slurm_output(self.job_id), errors="replace") as f:
                return f.read()
        except FileNotFoundError:
            return ""

    def job_info(self) -> dict[str, str] | None:
        """scontrol's fields for the job; {} once it has left the controller; None when scontrol did not answer."""
        answer = client.show_job(str(self.job_id), SLURM_TIMEOUT_S)
        if answer is None:
            return None
        if "JobState" in answer.fields:
            return answer.fields
        return {} if answer.unknown else None

    def partition_info(self, name: str | None) -> dict[str, str] | None:
        return client.show_partition(name, SLURM_TIMEOUT_S) if name else None

    def follow(self, monitor, timeout_s: float | None = None) -> int | None:
        seen = _Seen()
        return monitor.follow(lambda: self._poll(seen), interval_s=2.0, timeout_s=timeout_s)

    def _poll(self, seen: _Seen) -> int | None:
        job = self.job_info()
        if job is None:
            return None  # scontrol did not answer in time: ask again at the next poll
        state = job.get("JobState", "UNKNOWN")
        self._show_state(job, state, seen)
        self._show_hang(seen)
        if state == "PENDING":
            return self._stop_if_never_starts(job)
        self._say_requeued(job, seen)
        if state in ENDED_STATES:
            self.finished_job = True
            return self._final_code(state, job)
        return None

    def _say_requeued(self, job: dict[str, str], seen: _Seen) -> None:
        restarts = int(job.get("Restarts", "0") or 0)
        if restarts > seen.restarts:
            seen.restarts = restarts
            self.hung = False
            say(f"job {self.job_id} requeued (restart {restarts}); still following: it resumes from the "
                "newest checkpoint when it runs again", console=self.console)

    def _show_hang(self, seen: _Seen) -> None:
        """The lines the job's hang watch wrote to its log (why, the verdict, the evidence, the stop), as they
        come."""
        if seen.job_log is None:
            seen.job_log = LineFollower(RunPaths(self.run_dir).slurm_output(str(self.job_id)))
        for line in seen.job_log.new_lines():
            if line.startswith(("llmtrain: hang", f"llmtrain: {HUNG}")):
                self.console.print(line, markup=False, highlight=False, soft_wrap=True)
                self.hung = self.hung or line.startswith(f"llmtrain: {HUNG}")

    def _final_code(self, state: str, job: dict[str, str]) -> int:
        """The job's exit status for the launcher: train.max_steps reached is the only success; a job whose
        workers stopped on a signal and that was not requeued is unfinished (EXIT_PREEMPTED, like a launcher
        preempted locally)."""
        statuses = rank_statuses(self.run_dir).values()
        stopped = [s for s in statuses if s.get("status") == "preempted"]
        if not stopped or any(s.get("status") == "error" for s in statuses):
            return 0 if state == "COMPLETED" and not stopped else (exit_code(job) or 1)
        step = max(int(s.get("step") or 0) for s in stopped)
        said = [ln for ln in self.job_output().splitlines() if ln.startswith("llmtrain: unfinished:")]
        why = said[-1][len("llmtrain: unfinished: "):] if said else "stopped on a signal, not requeued"
        say(f"job {self.job_id} ended unfinished at step {step} ({why}); the same llmtrain launch command "
            "continues from the newest checkpoint", console=self.console)
        self.unfinished = True
        return EXIT_UNFINISHED

    def _show_state(self, job: dict[str, str], state: str, seen: _Seen) -> None:
        reason = job.get("Reason", "None")
        if state == seen.state and reason == seen.reason:
            return
        seen.state, seen.reason = state, reason
        if state == "RUNNING":
            detail = (f" on {job.get('NodeList', '?')}; rendezvous at {self._first_node(job.get('NodeList'))}:"
                      f"{self.rendezvous_port()}")
        else:
            detail = f" (Reason={reason})" if reason not in ("None", "") else ""
        say(f"job {self.job_id} {state}{detail}", console=self.console)

    def _first_node(self, nodelist: str | None) -> str:
        names = client.hostnames(nodelist, SLURM_TIMEOUT_S) if nodelist else None
        return names[0] if names else "the job's first node"

    def _stop_if_never_starts(self, job: dict[str, str]) -> int | None:
        reason = job.get("Reason")
        if reason not in NEVER_STARTS:
            return None
        partition = self.partition_info(job.get("Partition")) if reason in NODE_COUNT_REASONS else None
        why = never_starts(job, partition)
        if why is None:
            return None
        failed = self.cancel()
        done = "cancelled it" if failed is None else f"could not cancel it ({failed}): scancel {self.job_id}"
        say(f"job {self.job_id} can never start ({why}); {done}", console=self.console)
        return EXIT_NEVER_STARTS

    def cancel(self) -> str | None:
        """scancel the job; None when that worked, else why not."""
        return client.cancel(str(self.job_id), timeout=SLURM_TIMEOUT_S)

    def signal_workers(self, sig: int) -> int:
        """Ask the job's workers to checkpoint and stop. A job that has not started has none: it is cancelled,
        which is what stopping it means."""
        if not self.job_id:
            return 0
        job = self.job_info()
        state = (job or {}).get("JobState")
        if state in NOT_STARTED_STATES:
            failed = self.cancel()
            done = "cancelled it" if failed is None else f"could not cancel it ({failed}): scancel {self.job_id}"
            say(f"job {self.job_id} is {state}: no worker to checkpoint; {done}", console=self.console)
            return 0
        if job == {} or state in FINAL_STATES:
            return 0
        # The job's steps only: a USR1 to the batch shell is a preemption notice, after which the job requeues
        # itself; a cancel is a stop.
        return 1 if client.cancel("--signal=USR1", str(self.job_id), timeout=SLURM_TIMEOUT_S) is None else 0

    def stop(self) -> None:
        """A submitted job belongs to Slurm: stopping the launcher only stops following it (scancel ends it)."""
