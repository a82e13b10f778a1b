"""cluster=local: torchrun on this node (node_rank of nnodes; nnodes=1 is the usual case).

torchrun runs under the node agent, whose stdin is a pipe from this launcher: when the launcher dies (kill -9, a
closed terminal) the pipe closes and the agent stops torchrun and every worker, so no job outlives its launcher.
"""

from __future__ import annotations

import os
import socket

from llmtrain.config.errors import ConfigError
from llmtrain.launch.node.start_culprits import record_launch_failure
from llmtrain.launch.supervision import processes
from llmtrain.launch.backends.base import Backend, NodeCommand, free_port, node_python, torchrun_argv, worker_env
from llmtrain.launch.backends.traits import traits_of
from llmtrain.launch.supervision.failures import report_failure
from llmtrain.launch.node.env import wrap_for_gloo
from llmtrain.launch.preflight import check_local_node
from llmtrain.rundir.paths import RunPaths


class LocalBackend(Backend):
    traits = traits_of("local")

    def __init__(self, cfg, run_dir, worker_module="llmtrain.worker"):
        super().__init__(cfg, run_dir, worker_module)
        c = cfg.cluster
        if c.nnodes > 1 and c.master_addr in ("127.0.0.1", "localhost"):
            raise ConfigError("cluster.master_addr", "cluster=local with nnodes > 1 starts this node only: set "
                                                     "cluster.master_addr to node 0's address (or use cluster=ssh "
                                                     "or cluster=slurm to start every node from here)")
        self.port = c.master_port or free_port()
        self.proc = None
        self.output: list[str] = []

    def host_names(self) -> list[str]:
        return [socket.gethostname()]

    def check_ready(self) -> None:
        if self.cfg.device == "cuda":
            import torch

            if not torch.cuda.is_available():
                raise ConfigError("device", "device=cuda but this node has no usable CUDA device "
                                            f"(torch {torch.__version__}, CUDA build: {torch.version.cuda or 'none'}); "
                                            "use device=auto or device=cpu")
        # A busy master port, and a plan that does not fit this node's memory (doctor trains nothing).
        check_local_node(self.cfg, training=self.worker_module == "llmtrain.worker")

    def node_commands(self) -> list[NodeCommand]:
        c = self.cfg.cluster
        argv = torchrun_argv(self.cfg, self.run_dir, c.nnodes, c.node_rank if c.nnodes > 1 else None,
                             f"{c.master_addr}:{self.port}", rdzv_id=f"llmtrain-{self.port}",
                             worker_module=self.worker_module)
        python, env = node_python(self.cfg), worker_env(self.cfg)
        agent = [python, "-m", "llmtrain.launch.node.agent", self.run_dir, str(c.node_rank), "--"]
        return [NodeCommand(host="localhost", node_rank=c.node_rank, argv=wrap_for_gloo(agent + argv, env, python),
                            env=env)]

    def run(self, monitor) -> int:
        cmd = self.node_commands()[0]
        env = dict(cmd.env, TMPDIR=RunPaths(self.run_dir).tmp)
        os.makedirs(env["TMPDIR"], exist_ok=True)
        log = RunPaths(self.run_dir).node_log(cmd.node_rank)
        self.proc = processes.start(cmd.argv, env, log, on_line=self.output.append, stdin_pipe=True)
        code = self.follow(monitor)
        if code != 0:
            record_launch_failure(self.run_dir, "".join(self.output), code, socket.gethostname())
            report_failure(monitor.console, self.run_dir, "".join(self.output), code,
                           node=self.cfg.cluster.node_rank)
        self.stop()
        return code

    def follow(self, monitor, timeout_s: float | None = None) -> int | None:
        return monitor.follow(self.proc.poll, timeout_s=timeout_s)

    def signal_workers(self, sig: int) -> int:
        return processes.signal_workers(self.proc.pid, sig) if self.proc else 0

    def stop(self) -> None:
        if self.proc is not None:
            try:
                self.proc.stdin.close()  # the agent stops its tree; stop_tree makes sure of it
            except (OSError, ValueError):
                pass
            processes.stop_tree(self.proc, grace_s=10.0)
