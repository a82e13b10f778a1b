"""The nodes of a Slurm partition and whether each can run a job, from `sinfo`, before anything is submitted; a
job's excluded nodes (scontrol's ExcNodeList) as names.

`sinfo -h -N -o '%N|%T|%P|%E'` prints one line per node and partition: name, state in long form (with a flag
suffix: `*` not responding, `~` powered off, `#` powering up, ...), partition (the default one ends in `*`) and
the reason an admin or Slurm gave for a down or drained node. A node counts as usable when it is not flagged as
not responding and its state is one a job can be scheduled on, now or once the jobs on it end.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from llmtrain.slurm import client

SINFO_FORMAT = "%N|%T|%P|%E"
CPUS_FORMAT = "%P|%c"  # partition, CPUs per node (one line per partition and node configuration)
SINFO_TIMEOUT_S = 20
# States a job can be placed on; anything else (down, drained, draining, fail, maint, unknown, ...) cannot.
USABLE_STATES = {"idle", "mixed", "allocated", "completing", "planned", "reserved"}
# Suffixes sinfo appends to a state; only "not responding" makes a node unusable (a powered-off cloud node boots).
FLAG_SUFFIXES = "*~#!%$@^-+"


@dataclass(frozen=True)
class NodeState:
    name: str
    state: str
    not_responding: bool
    reason: str | None

    @property
    def usable(self) -> bool:
        return not self.not_responding and self.state in USABLE_STATES

    def line(self) -> str:
        flag = ", not responding" if self.not_responding else ""
        return f"{self.name}: {self.state}{flag}" + (f" ({self.reason})" if self.reason else "")


def parse_state(raw: str) -> tuple[str, bool]:
    """("drained", False) from "drained"; ("idle", True) from "idle*"."""
    raw = raw.strip().lower()
    state = raw.rstrip(FLAG_SUFFIXES)
    return state, "*" in raw[len(state):]


def parse_sinfo(text: str, partition: str | None) -> tuple[str | None, list[NodeState]]:
    """The partition's name and its nodes, once each. Without a partition, the default one (marked `*`), or every
    node when sinfo marks none."""
    rows = [line.split("|", 3) for line in text.splitlines() if line.count("|") >= 3]
    if partition is None:
        defaults = [r for r in rows if r[2].strip().endswith("*")]
        partition = defaults[0][2].strip().rstrip("*") if defaults else None
    if partition is not None:
        rows = [r for r in rows if r[2].strip().rstrip("*") == partition]
    nodes: dict[str, NodeState] = {}
    for name, state, _, reason in rows:
        base, not_responding = parse_state(state)
        reason = reason.strip()
        nodes.setdefault(name.strip(), NodeState(name.strip(), base, not_responding,
                                                 None if reason.lower() in ("", "none") else reason))
    return partition, list(nodes.values())


def run_sinfo(partition: str | None) -> tuple[str | None, str | None]:
    """(sinfo's output, None), or (None, why it gave none)."""
    return client.sinfo(["-h", "-N", "-o", SINFO_FORMAT] + (["-p", partition] if partition else []), SINFO_TIMEOUT_S)


def parse_cpus(text: str, partition: str | None) -> int | None:
    """The fewest CPUs a node of the partition (without one, the default partition, marked `*`) has, from `sinfo -h
    -o '%P|%c'`; None when sinfo names none. The fewest, so that any of its nodes can run the job."""
    rows = [line.split("|", 1) for line in text.splitlines() if "|" in line]
    if partition is None:
        rows = [r for r in rows if r[0].strip().endswith("*")]
    else:
        rows = [r for r in rows if r[0].strip().rstrip("*") == partition]
    counts = [int(m.group()) for _, cpus in rows if (m := re.match(r"\d+", cpus.strip()))]
    return min(counts) if counts else None


def partition_cpus(partition: str | None) -> int | None:
    """CPUs per node of the partition, as sinfo tells it (parse_cpus); None when sinfo cannot say."""
    text, _ = client.sinfo(["-h", "-o", CPUS_FORMAT] + (["-p", partition] if partition else []), SINFO_TIMEOUT_S)
    return None if text is None else parse_cpus(text, partition)


def split_hosts(text: str | None) -> list[str]:
    """Slurm's ExcNodeList (`node1,node3`; `(null)` when empty) as names. Ranges (`node[1-3]`) stay one name:
    Slurm reads them back as they were."""
    if not text or text == "(null)":
        return []
    return [h for h in text.split(",") if h]
