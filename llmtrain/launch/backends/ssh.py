"""cluster=ssh: torchrun on every host of a hostfile, started in parallel over ssh from the head node.

Each host runs `node.agent -- torchrun ...` in the same working directory and Python (shared filesystem), with
the network/env variables exported explicitly. The ssh connection's stdin ties the remote tree to the launcher:
closing it stops everything on that host. Every value that reaches the remote shell goes through shlex.quote, and
hostnames are validated when the hostfile is read; cluster.setup lines run before the agent (see node/setup.py).

A node the head node cannot reach (a network partition never closes a connection) is found from both ends: ssh's
keepalives (ssh_options.SSH_KEEPALIVE) end the launcher's connection to it within seconds, naming it, and the node
agent stops that node's processes when the launcher's heartbeat lines stop coming (node.agent.HEARTBEAT_ENV).

The rendezvous port is one per run: cluster.master_port when set; else a free port of the first host when the
launcher runs there (checked by binding it); else one drawn at random from RANDOM_PORTS, said in the start line,
since the first host's free ports cannot be checked from here.
"""

from __future__ import annotations

import os
import random
import shlex
import socket
import threading
import time
import uuid

from rich.markup import escape

from llmtrain.config.derived import world_size
from llmtrain.config.errors import ConfigError
from llmtrain.console import plain, say
from llmtrain.launch.node.start_culprits import record_launch_failure
from llmtrain.launch.supervision import processes
from llmtrain.launch.backends.reachability import check_host
from llmtrain.launch.backends.ssh_options import ssh_base
from llmtrain.launch.backends.base import Backend, NodeCommand, free_port, node_python, torchrun_argv, worker_env
from llmtrain.launch.backends.traits import traits_of
from llmtrain.launch.container import in_container, setup_outside
from llmtrain.launch.hostfile import cluster_hosts
from llmtrain.launch.supervision.failures import (SSH_ERROR, agent_failures, culprit_node, finished_ranks,
                                                  report_failure, tail)
from llmtrain.launch.node.agent import HEARTBEAT_ENV
from llmtrain.launch.node.env import wrap_for_gloo
from llmtrain.launch.node.setup import setup_statements
from llmtrain.launch.supervision.placement import node_label
from llmtrain.rundir.paths import RunPaths

# Below Linux's ephemeral range (32768-60999), where outgoing connections take their ports.
RANDOM_PORTS = (20000, 32767)
# After the first node fails, how long the others get to fail on their own: their torchrun summaries tell which
# node's rank died first (the first node to exit is often one whose ranks only lost a peer).
SETTLE_S = 15.0
HEARTBEAT_S = 5
# How long a fresh connection gets to tell an unreachable host from a lost agent.
PROBE_TIMEOUT_S = 5


def remote_command(cmd: NodeCommand, workdir: str, setup=()) -> str:
    """One shell string: cd, the cluster.setup lines, then exec env VAR=value... argv. Every piece is quoted but the
    set-up lines, which are shell code on purpose, each run on its own (node/setup.py)."""
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


def rendezvous_port(cluster, head: str) -> tuple[int, str]:
    """The rendezvous port on `head` and where it comes from (said when the job starts)."""
    if cluster.master_port:
        return cluster.master_port, "cluster.master_port"
    if is_this_host(head):
        return free_port(""), "a free port of this host"
    return random.randint(*RANDOM_PORTS), (f"a random port: {head} is not this host, so whether it is free cannot "
                                           "be checked from here; cluster.master_port=N chooses one")


class SSHBackend(Backend):
    traits = traits_of("ssh")

    def check_ready(self) -> None:
        import shutil

        if shutil.which("ssh") is None:
            raise ConfigError("cluster.name", "cluster=ssh but the ssh client is not on PATH on this node")

    def __init__(self, cfg, run_dir, worker_module="llmtrain.worker", hosts=None):
        super().__init__(cfg, run_dir, worker_module)
        # `hosts`: the ones a start of a run on fewer nodes runs on (launch/reachable_starts.py)
        self.hosts = hosts or cluster_hosts(cfg.cluster)
        self.lost_hosts: list[str] = []  # hosts that stopped answering while the job ran
        self.port, self.port_origin = rendezvous_port(cfg.cluster, self.hosts[0].name)
        self.rdzv_id = f"llmtrain-{uuid.uuid4().hex[:12]}"
        self.workdir = cfg.cluster.workdir or os.getcwd()
        self.procs: list = []
        self.outputs: list[list[str]] = []
        self.failure_order: list[int] = []  # node indices, in the order their agents were seen failing
        self.stdin_lock = threading.Lock()  # heartbeat thread and main thread both write to the agents
        self.heartbeat_stop = threading.Event()

    def host_names(self) -> list[str]:
        return [host.name for host in self.hosts]

    def node_commands(self) -> list[NodeCommand]:
        cmds = []
        head = self.hosts[0].name
        for rank, host in enumerate(self.hosts):
            torchrun = torchrun_argv(self.cfg, self.run_dir, len(self.hosts), rank, f"{head}:{self.port}",
                                     self.rdzv_id, self.worker_module)
            env, python = {**worker_env(self.cfg), HEARTBEAT_ENV: str(HEARTBEAT_S)}, node_python(self.cfg)
            argv = wrap_for_gloo([python, "-m", "llmtrain.launch.node.agent", self.run_dir, str(rank), "--",
                                  *torchrun], env, python)
            argv = in_container(self.cfg, argv, env, self.workdir, self.run_dir)
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
        return ssh_base(self.cfg.cluster) + [cmd.host, remote_command(cmd, self.workdir, setup_outside(self.cfg))]

    def run(self, monitor) -> int:
        say(f"{self.endpoint_line()}; starting {len(self.hosts)} node(s) over ssh: "
            f"{', '.join(self.host_names())}", console=monitor.console)
        started = time.time()
        for cmd in self.node_commands():
            output: list[str] = []
            log = RunPaths(self.run_dir).node_log(cmd.node_rank)
            self.procs.append(processes.start(self.ssh_argv(cmd), {}, log, on_line=output.append, stdin_pipe=True))
            self.outputs.append(output)
        threading.Thread(target=self._heartbeat, daemon=True).start()
        code = self.follow(monitor)
        if code != 0:
            self._settle()
            if self._finished_anyway(monitor.console, started):
                code = 0
            else:
                self._report(monitor.console, code)
        self.stop()
        return code

    def _heartbeat(self) -> None:
        while not self.heartbeat_stop.wait(HEARTBEAT_S):
            self._send("alive")

    def _finished_anyway(self, console, since: float) -> bool:
        """Every rank of this launch finished, and a node's agent or connection was lost afterwards: a warning."""
        if len(finished_ranks(self.run_dir, since)) < world_size(self.cfg):
            return False
        codes = [p.poll() for p in self.procs]
        for node, code in enumerate(codes):
            if code not in (None, 0):
                say(f"warning: {node_label(node, self.hosts[node].name)} lost its node agent "
                    f"or ssh connection (exit code {code}) after every rank finished; the run finished",
                    console=console)
        return True

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
        outputs = ["".join(o) for o in self.outputs]
        node = culprit_node(self.run_dir, outputs, codes, self.failure_order)
        record_launch_failure(self.run_dir, outputs[node], codes[node] or code, self.hosts[node].name)
        where = node_label(node, self.hosts[node].name)
        log = RunPaths(self.run_dir).node_log(node)
        if codes[node] == SSH_ERROR and not agent_failures(outputs[node]):
            # The connection or the agent went, not a rank: the ranks' errors are its consequences.
            console.print(f"[bold red]llmtrain: {where} {escape(self._lost_why(node))}[/]" + escape(
                f"; stopping the other nodes; its log: {log}"), highlight=False, soft_wrap=True)
            return
        console.print(f"[bold red]llmtrain: {where} failed with exit code {codes[node]}[/]; "
                      f"stopping the other nodes", highlight=False)
        for line in tail(log, 8):
            plain(f"  {line}", console=console)
        report_failure(console, self.run_dir, outputs[node], code, node=node, host=self.hosts[node].name)

    def _lost_why(self, node: int) -> str:
        """Why a node's connection ended (ssh exit 255): a fresh connection tells a host that cannot be reached
        from one that lost its agent (ssh itself often says nothing: LogLevel ERROR hides its keepalive timeout)."""

        probe = check_host(self.cfg.cluster, self.hosts[node].name, PROBE_TIMEOUT_S)
        if probe.error is None:
            return f"lost its node agent or ssh connection (ssh exit code {SSH_ERROR}; the host still answers ssh)"
        self.lost_hosts.append(self.hosts[node].name)
        return (f"is unreachable (its ssh connection ended with exit code {SSH_ERROR}; a new one failed after "
                f"{probe.seconds:.1f} s: {probe.error})")

    def _send(self, line: str | None) -> None:
        with self.stdin_lock:
            self._send_locked(line)

    def _send_locked(self, line: str | None) -> None:
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
        self.heartbeat_stop.set()
        self._send(None)
        for proc in self.procs:
            try:
                proc.wait(timeout=20)
            except Exception:  # noqa: BLE001 - a stuck ssh is killed below
                pass
            if proc.poll() is None:
                processes.stop_tree(proc, grace_s=5)
