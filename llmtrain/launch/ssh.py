"""cluster=ssh: torchrun on every host of a hostfile, started in parallel over ssh from the head node.

Each host runs `node_agent -- torchrun ...` in the same working directory and Python (shared filesystem), with
the network/env variables exported explicitly. The ssh connection's stdin ties the remote tree to the launcher:
closing it stops everything on that host. Every value that reaches the remote shell goes through shlex.quote, and
hostnames are validated when the hostfile is read; cluster.setup lines run before the agent (see node_setup).

The rendezvous port is one per run: cluster.master_port when set; else a free port of the first host when the
launcher runs there (checked by binding it); else one drawn at random from RANDOM_PORTS, said in the start line,
since the first host's free ports cannot be checked from here.
"""

from __future__ import annotations

import os
import random
import shlex
import socket
import time
import uuid

from llmtrain.config.errors import ConfigError
from llmtrain.launch import processes
from llmtrain.launch.backend import Backend, NodeCommand, node_python, torchrun_argv, worker_env
from llmtrain.launch.hostfile import cluster_hosts
from llmtrain.launch.failures import culprit_node, report_failure, tail
from llmtrain.launch.node_env import wrap_for_gloo
from llmtrain.launch.node_setup import setup_statements

# Below Linux's ephemeral range (32768-60999), where outgoing connections take their ports.
RANDOM_PORTS = (20000, 32767)
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


def remote_command(cmd: NodeCommand, workdir: str, setup=()) -> str:
    """One shell string: cd, the cluster.setup lines, then exec env VAR=value... argv. Every piece is quoted but the
    set-up lines, which are shell code on purpose, each run on its own (node_setup)."""
    exports = [f"{k}={v}" for k, v in sorted(cmd.env.items())]
    run = f"exec env {shlex.join(exports)} {shlex.join(cmd.argv)}"
    if not setup:
        return f"cd {shlex.quote(workdir)} && {run}"
    return "; ".join([f"cd {shlex.quote(workdir)} || exit 1", *setup_statements(setup), run])


def _bindable(address: str) -> bool:
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    try:
        with socket.socket(family) as s:
            s.bind((address, 0))
        return True
    except OSError:
        return False


def is_this_host(name: str) -> bool:
    """Whether `name` is this machine: its own host name, or a name whose address can be bound here."""
    if name == "localhost" or name.split(".")[0] == socket.gethostname().split(".")[0]:
        return True
    try:
        addresses = {info[4][0] for info in socket.getaddrinfo(name, None, type=socket.SOCK_STREAM)}
    except OSError:
        return False
    return any(_bindable(a) for a in addresses)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def rendezvous_port(cluster, head: str) -> tuple[int, str]:
    """The rendezvous port on `head` and where it comes from (said when the job starts)."""
    if cluster.master_port:
        return cluster.master_port, "cluster.master_port"
    if is_this_host(head):
        return free_port(), "a free port of this host"
    return random.randint(*RANDOM_PORTS), (f"a random port: {head} is not this host, so whether it is free cannot "
                                           "be checked from here; cluster.master_port=N chooses one")


class SSHBackend(Backend):
    name = "ssh"

    def check_ready(self) -> None:
        import shutil

        if shutil.which("ssh") is None:
            raise ConfigError("cluster.name", "cluster=ssh but the ssh client is not on PATH on this node")

    def __init__(self, cfg, run_dir, worker_module="llmtrain.worker"):
        super().__init__(cfg, run_dir, worker_module)
        self.hosts = cluster_hosts(cfg.cluster)
        self.port, self.port_origin = rendezvous_port(cfg.cluster, self.hosts[0].name)
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
            env, python = worker_env(self.cfg), node_python(self.cfg)
            argv = wrap_for_gloo([python, "-m", "llmtrain.launch.node_agent", self.run_dir, str(rank), "--",
                                  *torchrun], env, python)
            cmds.append(NodeCommand(host=host.name, node_rank=rank, argv=argv, env=env))
        return cmds

    def endpoint_line(self) -> str:
        return f"rendezvous at {self.hosts[0].name}:{self.port} ({self.port_origin})"

    def preview(self) -> str:
        lines = [self.endpoint_line()]
        if self.cfg.cluster.setup:
            lines.append("set-up on every node, in order, before the node agent (cluster.setup):")
            lines += [f"  {line}" for line in self.cfg.cluster.setup]
        return "\n".join(lines + [super().preview()])

    def command_line(self, cmd: NodeCommand) -> str:
        return shlex.join(self.ssh_argv(cmd))

    def ssh_argv(self, cmd: NodeCommand) -> list[str]:
        return ssh_base(self.cfg.cluster) + [cmd.host, remote_command(cmd, self.workdir, self.cfg.cluster.setup)]

    def run(self, monitor) -> int:
        monitor.console.print(f"llmtrain: {self.endpoint_line()}; starting {len(self.hosts)} node(s) over ssh",
                              markup=False, highlight=False, soft_wrap=True)
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
