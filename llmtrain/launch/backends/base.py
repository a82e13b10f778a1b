"""The launcher interface every backend (local, ssh, slurm) implements."""

from __future__ import annotations

import abc
import os
import random
import shlex
import socket
import sys
from dataclasses import dataclass, field
from pathlib import Path

from omegaconf import DictConfig

from llmtrain.launch.backends.traits import BackendTraits


@dataclass
class NodeCommand:
    """What runs on one node: the command line, the environment it adds, and where."""

    host: str
    node_rank: int
    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)

    def shell(self) -> str:
        exports = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(self.env.items()))
        return f"{exports} {shlex.join(self.argv)}".strip()


class Backend(abc.ABC):
    # What this backend is (traits.py): each backend class sets `traits = traits_of("its name")`.
    traits: BackendTraits
    # A queued backend (traits.queued) calls this with the job id once the scheduler took the job; the launcher
    # sets it, so that the run directory's lock names the job.
    on_submitted = None

    @property
    def name(self) -> str:
        return self.traits.name

    @property
    def owns_processes(self) -> bool:
        """Whether the job's processes are this launcher's to stop (local, ssh), or a scheduler's (Slurm)."""
        return self.traits.owns_processes

    def __init__(self, cfg: DictConfig, run_dir: str, worker_module: str = "llmtrain.worker"):
        self.cfg = cfg
        self.run_dir = run_dir
        # What torchrun runs on every rank: the trainer, or `llmtrain doctor`'s preflight.
        self.worker_module = worker_module

    def check_ready(self) -> None:
        """What this node can tell before anything is written or started (tools on PATH, devices); raises
        ConfigError."""

    def host_names(self) -> list[str] | None:
        """The hosts the job runs on, when known before it starts (Slurm picks them when the job starts)."""
        return None

    def job_holding_run_dir(self) -> str | None:
        """A job that keeps running after the launcher exits (a Slurm job id), which then holds the run dir."""
        return None

    @abc.abstractmethod
    def node_commands(self) -> list[NodeCommand]:
        """The commands that start torchrun on each node (shown by --dry-run, run by launch)."""

    def command_line(self, cmd: NodeCommand) -> str:
        """How a node's command is actually run, as shell text (ssh wraps it)."""
        return cmd.shell()

    def preview(self) -> str:
        """What --dry-run prints after the config: each node's command and the environment it adds."""
        out = []
        for cmd in self.node_commands():
            out.append(f"node {cmd.node_rank} ({cmd.host}):\n{self.command_line(cmd)}\nenvironment added:")
            out += [f"  {k}={v}" for k, v in sorted(cmd.env.items())]
        return "\n".join(out)

    @abc.abstractmethod
    def run(self, monitor) -> int:
        """Start the job, drive `monitor` until it ends, stop everything on failure; return the exit code."""

    @abc.abstractmethod
    def follow(self, monitor, timeout_s: float | None = None) -> int | None:
        """Keep following a started job; its exit code, or None if it still runs after timeout_s."""

    @abc.abstractmethod
    def signal_workers(self, sig: int) -> int:
        """Send `sig` to every worker process (not the torchrun agents); return how many got it."""

    def stop(self) -> None:
        """Stop every process the backend started (Ctrl-C, failure, preemption timeout)."""


# The interpreter an NGC-style image (and most others) puts on its PATH.
CONTAINER_PYTHON = "python"


def node_python(cfg: DictConfig) -> str:
    """cluster.python; unset: the image's `python` in a container (this launcher's interpreter is not in the
    image), else the launcher's own interpreter path."""
    if cfg.cluster.python:
        return cfg.cluster.python
    return CONTAINER_PYTHON if cfg.cluster.container.runtime != "none" else sys.executable


def torchrun_argv(cfg: DictConfig, run_dir: str, nnodes: int, node_rank: int | None, rdzv_endpoint: str,
                  rdzv_id: str, worker_module: str = "llmtrain.worker") -> list[str]:
    """torchrun for one node. c10d rendezvous: every node gets the same endpoint and id."""
    c = cfg.cluster
    prefix = []
    if cfg.profile.nsys:
        # One Nsight Systems report per node (the agent and its workers), named by host.
        prefix = ["nsys", "profile", "--trace=cuda,nvtx,osrt", "--force-overwrite=true",
                  f"--output={run_dir}/profile/nsys-%h"]
    argv = prefix + [node_python(cfg), "-m", "torch.distributed.run",
            f"--nnodes={nnodes}", f"--nproc-per-node={c.nproc_per_node}",
            "--rdzv-backend=c10d", f"--rdzv-endpoint={rdzv_endpoint}", f"--rdzv-id={rdzv_id}",
            f"--max-restarts={cfg.launch.max_restarts}"]
    if node_rank is not None:
        argv.append(f"--node-rank={node_rank}")
    return argv + ["-m", worker_module, run_dir]


# Where an object store's client finds the store, forwarded from the launcher to workers that use one (an ssh
# node's shell would not have them). Never the keys or tokens: a command line is visible to every user of the node
# (ps), so credentials reach remote workers only through that account's own ~/.aws files or environment.
STORE_ENV = ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_PROFILE", "AWS_REGION", "AWS_DEFAULT_REGION",
             "AWS_CONFIG_FILE", "AWS_SHARED_CREDENTIALS_FILE", "AWS_CA_BUNDLE")


def store_env(cfg: DictConfig) -> dict[str, str]:
    """The launcher's STORE_ENV variables that are set, when checkpoint.dir, checkpoint.resume or model.init_from
    is an object-store URI; {} otherwise."""
    from llmtrain.checkpoint.storage import is_uri

    named = (cfg.checkpoint.get("dir"), cfg.checkpoint.get("resume"), cfg.model.get("init_from"))
    if not any(location and is_uri(str(location)) for location in named):
        return {}
    return {name: os.environ[name] for name in STORE_ENV if os.environ.get(name)}


def worker_env(cfg: DictConfig) -> dict[str, str]:
    """Environment every worker gets on top of the node's: network preset, `env:` extras, the object store's
    endpoint and profile (store_env), and what makes torchrun restarts and imports work."""
    env = {str(k): str(v) for k, v in cfg.network.env.items()}
    env.update({str(k): str(v) for k, v in cfg.env.items()})
    for name, value in store_env(cfg).items():
        env.setdefault(name, value)  # an `env:` entry of the config wins
    if cfg.launch.omp_num_threads:
        env.setdefault("OMP_NUM_THREADS", str(cfg.launch.omp_num_threads))
    elif cfg.cluster.name == "local":
        # This node's cores split over its processes (remote nodes: torchrun's own default applies).
        env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // cfg.cluster.nproc_per_node)))
    env.setdefault("PYTHONUNBUFFERED", "1")
    # NCCL's Flight Recorder: the last collectives of each rank, dumped with a hang's evidence (no cost on gloo).
    env.setdefault("TORCH_FR_BUFFER_SIZE", "2000")  # its older name, TORCH_NCCL_TRACE_BUFFER_SIZE, warns on every rank
    # Restarted workers otherwise reuse the agent's stale TCPStore and fail to connect (pytorch issue 135712).
    env.setdefault("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "1")
    # Workers import llmtrain from the same place as the launcher, also from a source checkout.
    package_root = str(Path(__file__).resolve().parents[3])
    current = os.environ.get("PYTHONPATH", "")
    env.setdefault("PYTHONPATH", package_root + (os.pathsep + current if current else ""))
    return env


# Rendezvous ports are drawn from here up to the kernel's ephemeral range.
PORT_FLOOR = 10000


def _ephemeral_start() -> int:
    """The first port the kernel hands out to outgoing connections."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768  # Linux's default


def free_port(address: str = "127.0.0.1") -> int:
    """A port free on this host now, for a rendezvous: on loopback, or on every interface ("") when other nodes
    connect to it. Drawn at random below the kernel's ephemeral range: a port of that range (what binding port 0
    gives) can be taken, in the seconds before the rendezvous listens on it, as the source port of any outgoing
    connection, such as another job's collectives, and the rendezvous then fails with EADDRINUSE."""
    low = _ephemeral_start()
    if low - PORT_FLOOR >= 1000:
        for port in random.Random().sample(range(PORT_FLOOR, low), 50):
            with socket.socket() as s:
                try:
                    s.bind((address, port))
                except OSError:
                    continue
                return port
    with socket.socket() as s:  # a host whose ephemeral range starts low: what the kernel gives
        s.bind((address, 0))
        return s.getsockname()[1]
