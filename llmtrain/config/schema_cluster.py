"""The cluster section of the config schema (cluster.*): where the nodes are, how many, how they are reached, and
what a Slurm job asks for. Imported by schema.py, which holds every other section."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Optional

from llmtrain.config.schema_choice import choice
from llmtrain.launch.backends.traits import BACKEND_NAMES


@dataclass
class ContainerConfig:
    # none | pyxis (Slurm's srun --container-image) | apptainer (`apptainer exec` around each node's command;
    # slurm and ssh).
    runtime: str = choice("none", "none", "pyxis", "apptainer")
    # pyxis: an enroot URI (nvcr.io#nvidia/pytorch:24.05-py3) or a .sqsh path; apptainer: a .sif path or docker:// URI.
    image: Optional[str] = None
    # SRC:DST[:FLAGS] bind mounts; the working and run directories are mounted at their own paths anyway.
    mounts: List[str] = field(default_factory=list)
    # Where the node's command runs inside (null = cluster.workdir, mounted at the same path).
    workdir: Optional[str] = None
    # More options for the runtime: srun's (pyxis), `apptainer exec`'s (apptainer).
    extra_args: List[str] = field(default_factory=list)
    # apptainer: the command (singularity where that is what the cluster has).
    executable: str = "apptainer"


@dataclass
class ClusterConfig:
    # local (this node) | ssh (hosts of a hostfile) | slurm (sbatch)
    name: str = choice("local", *BACKEND_NAMES)
    nnodes: int = 1
    # The fewest nodes a run accepts (null = cluster.nnodes). A start on fewer nodes than nnodes (nodes down,
    # excluded, unreachable) re-plans the layout for the nodes it has and resumes; a later start grows back.
    min_nnodes: Optional[int] = None
    # null (cluster=ssh's default): the slots of the hostfile's hosts, which must all be the same.
    nproc_per_node: Optional[int] = 2
    # local: this node's rank when you start each node by hand.
    node_rank: int = 0
    # local: rendezvous host; ssh/slurm use their first node.
    master_addr: str = "127.0.0.1"
    # Rendezvous port; 0 = one per job: a free port (local; ssh when the launcher runs on the first host, else a
    # random one), 20000 + job id % 20000 (slurm).
    master_port: int = 0
    # Python on the nodes (null = the launcher's own interpreter path; with cluster.container, the image's
    # `python`) and the folder commands run in
    # (null = the launcher's working directory); both must exist on every node (shared filesystem).
    python: Optional[str] = None
    workdir: Optional[str] = None
    # ssh, slurm: shell lines run in order before the node agent (`module load cuda/12.4`, `source
    # /shared/venv/bin/activate`); a failing line stops the node, naming it.
    setup: List[str] = field(default_factory=list)
    # ssh: DeepSpeed-style hostfile (`host slots=N`), host filters (',' or '@' separated), ssh options.
    hostfile: Optional[str] = None
    include: Optional[str] = None
    exclude: Optional[str] = None
    ssh_port: Optional[int] = None
    ssh_user: Optional[str] = None
    ssh_identity: Optional[str] = None
    ssh_config: Optional[str] = None
    # slurm: sbatch options.
    partition: Optional[str] = None
    account: Optional[str] = None
    # --time of the job; null = the partition's default limit.
    time: Optional[str] = "04:00:00"
    gpus_per_node: Optional[int] = None  # None: one GPU per process (none with device=cpu)
    # --cpus-per-task of each node's one task (the node agent, torchrun and its workers); null = the CPUs of the
    # partition's nodes (sinfo), else one per process when sinfo cannot say.
    cpus_per_node: Optional[int] = None
    job_name: Optional[str] = None
    requeue: bool = True
    # slurm: a requeue (after the time limit, a preemption or a failure) leaves out the hosts RUN_DIR/nodes.json
    # holds bad: one start-up failure, or bad_node_failures rank failures and hangs; merged with the job's own
    # exclusions (cluster.sbatch_extra's --exclude).
    exclude_bad_nodes: bool = True
    bad_node_failures: int = 2
    # slurm: stop requeueing after this many starts in a row that saved no new checkpoint (0: never stop).
    max_starts_without_progress: int = 3
    # Seconds before the time limit at which the job sends its workers SIGUSR1 (checkpoint and stop).
    signal_before_end_s: int = 120
    sbatch_extra: List[str] = field(default_factory=list)
    # After submitting, follow the job's state and log until it ends and exit with its status.
    follow: bool = False
    # slurm, ssh: run each node's process in a container image.
    container: ContainerConfig = field(default_factory=ContainerConfig)
