"""cluster=ssh with cluster.min_nnodes < cluster.nnodes: every start runs on the hosts that answer.

Before each start every host of the hostfile (after cluster.include / cluster.exclude, spares past cluster.nnodes
too) is probed over ssh at once; the first cluster.nnodes that answer run it. With fewer than cluster.nnodes, the
layout is re-planned for them (launch/shape/replan.py) and said in one line. When a start ends because a host
stopped answering (the ssh backend tells an unreachable host from a lost agent), the launcher starts again on the
hosts that answer now, from the newest checkpoint, as long as at least cluster.min_nnodes do and starts keep saving
new checkpoints (cluster.max_starts_without_progress). A later launch probes every host again: the run grows back.
"""

from __future__ import annotations

import os
import time

from llmtrain.checkpoint import store
from llmtrain.checkpoint.resume import Resolution
from llmtrain.console import say
from llmtrain.errors import EXIT_FAILED
from llmtrain.launch.backends.reachability import check_hosts
from llmtrain.launch.backends.ssh import SSHBackend
from llmtrain.launch.goodput_entry import record_start
from llmtrain.launch.hostfile import parse_hostfile, select_hosts
from llmtrain.launch.shape.check import min_nnodes
from llmtrain.launch.shape.replan import replan, shape_line, with_overrides
from llmtrain.launch.shape.start_record import record_facts
from llmtrain.rundir import goodput


def answering_hosts(cfg) -> tuple[list, list[str]]:
    """(the first cluster.nnodes hosts that answer ssh, one line per host that does not)."""
    c = cfg.cluster
    hosts = select_hosts(parse_hostfile(c.hostfile), c.include, c.exclude)
    checks = check_hosts(c, [h.name for h in hosts], cfg.doctor.connect_timeout_s)
    answered = [h for h, check in zip(hosts, checks) if check.error is None]
    return answered[:c.nnodes], [check.line() for check in checks if check.error is not None]


def run_on_answering_hosts(cfg, console, record, start_and_follow) -> int:
    """Starts until one ends for another reason than a lost host (module docstring); its exit code.
    `start_and_follow(cfg, backend)` runs one start as the launcher runs any."""
    run_dir = cfg.run.dir
    fewest = min_nnodes(cfg)
    progress, without_progress, start = store.newest_step(run_dir), 0, 0
    while True:
        hosts, silent = answering_hosts(cfg)
        if len(hosts) < fewest:
            say(f"only {len(hosts)} host(s) answer ssh, fewer than cluster.min_nnodes={fewest}: "
                + "; ".join(silent), console=console)
            return EXIT_FAILED
        shape = replan(cfg, len(hosts))
        names = [h.name for h in hosts]
        if shape.overrides or start:
            say(shape_line(cfg, shape, names, ("not answering: " + "; ".join(silent)) if silent else None)
                .removeprefix("llmtrain: "), console=console)
        facts = record_facts(cfg, shape, names, record.entry)
        if start:  # the workers of a new start resume the newest checkpoint, as after any restart
            facts["resume"] = _resume_record(cfg, record.entry.get("resume"), start)
        record.update(**facts)
        start_cfg = with_overrides(cfg, shape.overrides)
        backend = SSHBackend(start_cfg, run_dir, hosts=hosts)
        goodput.clear_events(run_dir)
        began = time.time()
        code = start_and_follow(start_cfg, backend)
        record_start(run_dir, began, launch=record.entry["launch"])
        if code == 0 or not backend.lost_hosts:
            return code
        step = store.newest_step(run_dir)
        without_progress = 0 if step != progress else without_progress + 1
        progress, start = step, start + 1
        limit = cfg.cluster.max_starts_without_progress
        if limit and without_progress >= limit:
            say(f"not starting again: {without_progress} start(s) in a row saved no new checkpoint "
                f"(cluster.max_starts_without_progress={limit})", console=console)
            return code
        say(f"{', '.join(backend.lost_hosts)} stopped answering: starting again on the hosts that answer, from the "
            "newest checkpoint", console=console)


def _resume_record(cfg, first: dict | None, start: int) -> dict | None:
    """What a later start's workers load: the run directory's newest complete checkpoint, else what the first start
    loaded (a run begun from another directory's checkpoint goes back to it)."""
    latest, _ = store.latest_complete(cfg.run.dir)
    if latest is None:
        return first
    why = f"start {start + 1} of this launch: newest complete checkpoint {os.path.basename(latest.path)}"
    return Resolution(cfg.checkpoint.resume, latest.path, why).to_record()
