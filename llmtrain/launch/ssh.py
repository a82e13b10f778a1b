"""cluster=ssh: torchrun on every host of a hostfile, started in parallel over ssh from the head node.

Each host runs `node_agent -- torchrun ...` in the same working directory and Python (shared filesystem), with
the network/env variables exported explicitly. The ssh connection's stdin ties the remote tree to the launcher:
closing it stops everything on that host. Every value that reaches the remote shell goes through shlex.quote, and
hostnames are validated when the hostfile is read.
"""

from __future__ import annotations

import os
import shlex
import time
import uuid

from llmtrain.config.errors import ConfigError
from llmtrain.launch import processes
from llmtrain.launch.backend import Backend, NodeCommand, node_python, torchrun_argv, worker_env
from llmtrain.launch.hostfile import cluster_hosts
from llmtrain.launch.failures import culprit_node, report_failure, tail

DEFAULT_PORT = 29500
# After the first node fails, how long the others get to fail on their own: their torchrun summaries tell which
# node's rank died first (the first node to exit is often one whose ranks only lost a peer).
SETTLE_S = 15.0


def ssh_base(cluster) -> list[str]:
    argv = ["ssh", "-o", "BatchMode=yes"]
    if cluster.ssh_config:
        argv += ["-F", cluster.ssh_config]
    if cluster.ssh_port:
        argv += ["-p", str(cluster.ssh_port)]
    if cluster.ssh_identity:
        argv += ["-i", cluster.ssh_identity]
    if cluster.ssh_user:
        argv += ["-l", cluster.ssh_user]
    return argv


def remote_command(cmd: NodeCommand, workdir: str) -> str:
    """One shell string: cd, then exec env VAR=value... argv; every piece quoted."""
    exports = [f"{k}={v}" for k, v in sorted(cmd.env.items())]
    return f"cd {shlex.quote(workdir)} && exec env {shlex.join(exports)} {shlex.join(cmd.argv)}"


class SSHBackend(Backend):
    name = "ssh"

    def check_ready(self) -> None:
        import shutil

        if shutil.which("ssh") is None:
            raise ConfigError("cluster.name", "cluster=ssh but the ssh client is not on PATH on this node")

    def __init__(self, cfg, run_dir, worker_module="llmtrain.worker"):
        super().__init__(cfg, run_dir, worker_module)
        self.hosts = cluster_hosts(cfg.cluster)
        self.port = cfg.cluster.master_port or DEFAULT_PORT
        self.rdzv_id = f"llmtrain-{uuid.uuid4().hex[:12]}"
        self.workdir = cfg.cluster.workdir or os.getcwd()
        self.procs: list = []
        self.outputs: list[list[str]] = []
        self.failure_order: list[int] = []  # node indices, in the order their agents were seen failing

    def node_commands(self) -> list[NodeCommand]:
        cmds = []
        head = self.hosts[0].name
        for rank, host in enumerate(self.hosts):
            torchrun = torchrun_argv(self.cfg, self.run_dir, len(self.hosts), rank, f"{head}:{self.port}",
                                     self.rdzv_id, self.worker_module)
            argv = [node_python(self.cfg), "-m", "llmtrain.launch.node_agent", self.run_dir, str(rank), "--",
                    *torchrun]
            cmds.append(NodeCommand(host=host.name, node_rank=rank, argv=argv, env=worker_env(self.cfg)))
        return cmds

    def command_line(self, cmd: NodeCommand) -> str:
        return shlex.join(self.ssh_argv(cmd))

    def ssh_argv(self, cmd: NodeCommand) -> list[str]:
        return ssh_base(self.cfg.cluster) + [cmd.host, remote_command(cmd, self.workdir)]

    def run(self, monitor) -> int:
        for cmd in self.node_commands():
            output: list[str] = []
            log = os.path.join(self.run_dir, "logs", f"node{cmd.node_rank}.log")
            self.procs.append(processes.start(self.ssh_argv(cmd), {}, log, on_line=output.append, stdin_pipe=True))
            self.outputs.append(output)
        code = self.follow(monitor)
        if code != 0:
            self._settle()
            self._report(monitor.console, code)
        self.stop()
        return code

    def _poll(self) -> int | None:
        codes = [p.poll() for p in self.procs]
        for node, c in enumerate(codes):
            if c not in (None, 0) and node not in self.failure_order:
                self.failure_order.append(node)
        if self.failure_order:
            return codes[self.failure_order[0]]
        return 0 if all(c == 0 for c in codes) else None

    def _settle(self) -> None:
        deadline = time.monotonic() + SETTLE_S
        while time.monotonic() < deadline and any(p.poll() is None for p in self.procs):
            time.sleep(0.2)
        self._poll()

    def follow(self, monitor, timeout_s: float | None = None) -> int | None:
        return monitor.follow(self._poll, timeout_s=timeout_s)

    def _report(self, console, code: int) -> None:
        codes = [p.poll() for p in self.procs]
        node = culprit_node(self.run_dir, ["".join(o) for o in self.outputs], codes, self.failure_order)
        host = self.hosts[node].name
        console.print(f"[bold red]llmtrain: node {node} ({host}) failed with exit code {codes[node]}[/]; "
                      f"stopping the other nodes")
        for line in tail(os.path.join(self.run_dir, "logs", f"node{node}.log"), 8):
            console.print(f"  {line}", markup=False, highlight=False)
        report_failure(console, self.run_dir, "".join(self.outputs[node]), code, node=node)

    def _send(self, line: str | None) -> None:
        for proc in self.procs:
            if proc.poll() is None and proc.stdin:
                try:
                    if line is None:
                        proc.stdin.close()
                    else:
                        proc.stdin.write(line + "\n")
                        proc.stdin.flush()
                except (BrokenPipeError, ValueError, OSError):
                    pass

    def signal_workers(self, sig: int) -> int:
        self._send("preempt")
        return sum(1 for p in self.procs if p.poll() is None)

    def stop(self) -> None:
        # Closing stdin makes each node agent stop its torchrun tree; then the local ssh clients go.
        self._send(None)
        for proc in self.procs:
            try:
                proc.wait(timeout=20)
            except Exception:  # noqa: BLE001 - a stuck ssh is killed below
                pass
            if proc.poll() is None:
                processes.stop_tree(proc, grace_s=5)
