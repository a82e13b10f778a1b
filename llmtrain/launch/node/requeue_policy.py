"""What a Slurm job decides at the end of a start, from RUN_DIR/nodes.json (rundir/node_ledger.py): which hosts its
requeue excludes, and whether it requeues at all. Pure functions of the ledger, so each rule is tested alone.

- A bad host: one start-up failure (a node that cannot even start the job will not start it next time either),
  or cluster.bad_node_failures rank failures and hangs together. Stragglers are recorded, never excluded: a slow
  node still trains.
- The crash-loop breaker: a start that saved no new checkpoint made no progress; after
  cluster.max_starts_without_progress such starts in a row the job stops requeueing, whatever the cause.
"""

from __future__ import annotations

import time

from llmtrain.rundir.node_ledger import last_detail, now_text


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def bad_hosts(ledger: dict, bad_node_failures: int) -> dict[str, str]:
    """host -> why it is bad (`2 failures: rank 1 exited 1`), for every host of the ledger that is."""
    out = {}
    for host, entry in sorted(ledger.get("hosts", {}).items()):
        startup = entry.get("startup", 0)
        failures = entry.get("failure", 0) + entry.get("hang", 0)
        if startup >= 1:
            out[host] = f"{_plural(startup, 'start-up failure')}: {last_detail(entry, ('startup',))}"
        elif bad_node_failures > 0 and failures >= bad_node_failures:
            out[host] = f"{_plural(failures, 'failure')}: {last_detail(entry, ('failure', 'hang'))}"
    return out


def exclusion(ledger: dict, current: list[str], bad_node_failures: int) -> tuple[list[str], dict[str, str]]:
    """(the job's ExcNodeList: the names it excludes already, the user's own, kept first, then every bad host not
    among them; the bad hosts newly added -> why)."""
    added = {h: why for h, why in bad_hosts(ledger, bad_node_failures).items() if h not in current}
    return [*current, *added], added


def too_few_left(partition_nodes: list[str] | None, excluded: list[str], nnodes: int,
                 key: str = "cluster.nnodes") -> str | None:
    """Why the job could never start again with `excluded` left out (fewer than nnodes nodes left), or None; None
    too when the partition's nodes are not known."""
    if not partition_nodes:
        return None
    left = [n for n in partition_nodes if n not in excluded]
    if len(left) >= nnodes:
        return None
    return (f"excluding {','.join(excluded)} would leave {len(left)} of the partition's {len(partition_nodes)} "
            f"node(s) for {key}={nnodes}")


def note_start(ledger: dict, job: str, restart: int, checkpoint_step: int | None) -> None:
    """A start of job `job` began with `checkpoint_step` as its newest checkpoint. A new job (a new launch) starts
    counting again: the user may have fixed the cause."""
    starts = ledger.setdefault("starts", {})
    if starts.get("job") != job:
        starts.clear()
        starts.update(job=job, without_progress=0)
        ledger["stopped"] = None
    starts.update(restart=restart, checkpoint_step=checkpoint_step, started=now_text(), started_s=time.time())


def note_end(ledger: dict, checkpoint_step: int | None, failure: str | None) -> int:
    """The start ended with `checkpoint_step` as the newest checkpoint (`failure`: what failed, or None); returns
    how many starts in a row have saved no new checkpoint."""
    starts = ledger.setdefault("starts", {})
    before = starts.get("checkpoint_step")
    progressed = checkpoint_step is not None and (before is None or checkpoint_step > before)
    starts["without_progress"] = 0 if progressed else starts.get("without_progress", 0) + 1
    starts["last_failure"] = failure
    return starts["without_progress"]


def breaker_reason(without_progress: int, max_starts: int, last_failure: str | None) -> str | None:
    """Why the job must not requeue again (`3 starts in a row saved no checkpoint (last: ...)`), or None.
    max_starts 0 turns the breaker off."""
    if max_starts <= 0 or without_progress < max_starts:
        return None
    last = f" (last: {last_failure})" if last_failure else ""
    return f"{without_progress} starts in a row saved no checkpoint{last}"
