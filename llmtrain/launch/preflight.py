"""cluster=local checks before anything is written: the master port is free, the planned memory fits this node.

A port another process listens on makes torchrun's rendezvous connect to that process and wait forever without a
word; a plan that does not fit ends in an out-of-memory kill (or swapping) minutes later, and one far over it
thrashes the whole machine first.
"""

from __future__ import annotations

import errno
import os
import socket
import subprocess
from typing import NamedTuple

from omegaconf import DictConfig

from llmtrain.config.errors import ConfigError
from llmtrain.console import plain
from llmtrain.launch.backends.traits import traits_of

# Device nodes of a GPU driver: without them device=auto trains on the CPU, and torch need not be imported to know.
GPU_DEVICE_NODES = ("/dev/nvidiactl", "/dev/kfd")


def check_local_node(cfg: DictConfig, training: bool = True) -> None:
    check_master_port(cfg)
    if training:
        warn_memory_fit(cfg)


def port_in_use(port: int) -> bool:
    """Whether binding `port` on every address fails because a socket listens on it (TIME_WAIT leftovers of an
    earlier run do not count: the rendezvous store reuses those too)."""
    for family, host in ((socket.AF_INET, "0.0.0.0"), (socket.AF_INET6, "::")):
        try:
            with socket.socket(family, socket.SOCK_STREAM) as s:
                s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                s.bind((host, port))
        except OSError as e:
            if e.errno == errno.EADDRINUSE:
                return True
            # EAFNOSUPPORT, EADDRNOTAVAIL: no IPv6 here; nothing to learn from this family
    return False


def check_master_port(cfg: DictConfig) -> None:
    """A master_port the user chose must be free on this node when this node hosts the rendezvous alone (when
    unset, the launcher picks a free one)."""
    c = cfg.cluster
    if not traits_of(c.name).launcher_is_the_node or c.nnodes != 1 or not c.master_port:
        return
    if port_in_use(c.master_port):
        raise ConfigError("cluster.master_port", f"port {c.master_port} on {c.master_addr} is in use by another "
                                                 "process; pick another or leave it 0 for a free one")


def _gib(n: float) -> str:
    return f"{n / 2**30:,.1f} GiB" if n >= 2**30 else f"{n / 2**20:,.0f} MiB"


def node_memory(cfg: DictConfig) -> tuple[float, int, str] | None:
    """(bytes, ranks sharing them, what they are) for the device the workers will train on here, or None when
    unknown. CPU ranks share the machine's memory; each GPU rank has a device of its own."""
    gpu_here = any(os.path.exists(p) for p in GPU_DEVICE_NODES)
    if cfg.device == "cuda" or (cfg.device == "auto" and gpu_here):
        gpu = gpu_memory()
        return (gpu[0], 1, f"the GPU's memory ({gpu[1]})") if gpu else None
    import psutil

    return float(psutil.virtual_memory().total), cfg.cluster.nproc_per_node, "this machine's memory"


def gpu_memory() -> tuple[float, str] | None:
    """The smallest GPU's memory in bytes and its name, from nvidia-smi: asking torch would set up CUDA in the
    launcher, which then holds GPU memory the workers lack."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=memory.total,name", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    rows = []
    for line in out.stdout.splitlines():
        mib, _, name = line.partition(",")
        try:
            rows.append((float(mib) * 2**20, name.strip()))
        except ValueError:
            continue
    return min(rows) if out.returncode == 0 and rows else None


def planned_peak_bytes(cfg: DictConfig) -> float:
    """`llmtrain plan`'s peak memory per rank (the heaviest pipeline rank); no hardware figure enters it."""
    from llmtrain.plan.estimate import build_plan

    neutral = {"name": "neutral", "peak_tflops": 1.0, "memory_gib": None, "intra_node_gbs": 1.0,
               "inter_node_gbs": 1.0, "efficiency": 0.5}
    return build_plan(cfg, 1e12, None, neutral).peak_bytes_per_rank


def memory_line(peak: float, memory: float, ranks: int, what: str) -> str:
    """The plan's peak against the memory, both figures and their ratio, in words that fit a warning, an error
    and the dry run's statement."""
    need = f"{_gib(peak)} per rank" + (f" x {ranks} ranks = {_gib(peak * ranks)}" if ranks > 1 else "")
    ratio = peak * ranks / memory
    verb = "but" if ratio > 1 else "and"
    times = f"{ratio:.2f}x" if ratio >= 0.01 else "under 0.01x"
    return f"the plan's peak memory is {need} {verb} {what} is {_gib(memory)} ({times}; see llmtrain plan)"


_SMALLER = "use a smaller train.micro_batch_size or model.seq_len, recompute=full, or more tp/pp/zero"


class MemoryFit(NamedTuple):
    fits: bool
    line: str  # the plan against the memory, as the launcher prints it (a warning when it does not fit)


def check_memory_fit(cfg: DictConfig) -> MemoryFit | None:
    """Refuse a plan over this node's memory by more than launch.max_memory_ratio (launch.require_fit=true: over
    it at all); else the plan against the memory, or None when not known here (another backend's nodes, no GPU
    figure). Called by a launch and by its dry run, before anything is written."""
    if not traits_of(cfg.cluster.name).launcher_is_the_node:
        return None
    found = node_memory(cfg)
    if found is None:
        return None
    memory, ranks, _ = found
    peak = planned_peak_bytes(cfg)
    line = memory_line(peak, *found)
    ratio, limit = peak * ranks / memory, cfg.launch.max_memory_ratio
    if limit is not None and ratio > limit:
        raise ConfigError("launch.max_memory_ratio", f"{line}, over {limit}x: it would thrash or be killed; "
                                                     f"{_SMALLER}, or launch.max_memory_ratio=null to start anyway")
    if ratio > 1 and cfg.launch.require_fit:
        raise ConfigError("launch.require_fit", f"{line}; {_SMALLER}, or launch.require_fit=false to start anyway")
    if ratio > 1:
        return MemoryFit(False, f"llmtrain: warning: {line}; the job will likely run out of memory "
                                "(launch.require_fit=true refuses such a launch)")
    return MemoryFit(True, f"llmtrain: {line}")


def warn_memory_fit(cfg: DictConfig) -> None:
    """A launch says the plan against the memory only when it does not fit."""
    fit = check_memory_fit(cfg)
    if fit is not None and not fit.fits:
        plain(fit.line)


def memory_unknown_line(cfg: DictConfig) -> str:
    """The dry run's statement when check_memory_fit has no memory to compare with."""
    where = ("the GPU's memory is not known here (nvidia-smi gave no figure)"
             if traits_of(cfg.cluster.name).launcher_is_the_node
             else f"the memory of cluster={cfg.cluster.name}'s nodes is not known here")
    return (f"llmtrain: the plan's peak memory is {_gib(planned_peak_bytes(cfg))} per rank; {where}, so it is not "
            "compared (llmtrain plan hardware=NAME compares it with a GPU's)")
