"""A detected hang, end to end on the launcher's side: ask every node agent for evidence, wait for their answers,
judge, and write the verdict where the user and `llmtrain status` look (RUN_DIR/hangs/<time>/verdict.txt)."""

from __future__ import annotations

import contextlib
import glob
import os
import re
import time

from llmtrain.launch.supervision.hang_verdict import verdict_and_culprits
from llmtrain.launch.supervision.placement import describe_rank, read_places
from llmtrain.rundir.node_ledger import record_node_event
from llmtrain.rundir.paths import RunPaths
from llmtrain.rundir.hang_files import node_answers, read_json, request_evidence, request_path
from llmtrain.rundir.unwritten import warn_unwritten

class HangDetected(Exception):
    """The job is hung; the message is the verdict line."""


def collect(run_dir: str, nnodes: int, wait_s: float) -> str:
    """Ask for evidence into RUN_DIR/hangs/<YYYYmmdd-HHMMSS>/ and wait until every node answered (or wait_s,
    launch.hang_evidence_wait_s, passed); return the folder."""
    folder = request_evidence(run_dir, time.strftime("%Y%m%d-%H%M%S"))
    deadline = time.monotonic() + wait_s
    while len(node_answers(folder, nnodes)) < nnodes and time.monotonic() < deadline:
        time.sleep(0.2)
    with contextlib.suppress(FileNotFoundError):
        os.remove(request_path(run_dir))  # agents started later must not answer it
    return folder


def _by_rank(folder: str, pattern: str, read) -> dict[int, object]:
    out = {}
    for path in glob.glob(os.path.join(folder, pattern)):
        m = re.search(r"rank(\d+)\.", os.path.basename(path))
        value = read(path)
        if m and value is not None:
            out[int(m[1])] = value
    return out


def _text(path: str) -> str | None:
    try:
        with open(path, errors="replace") as f:
            return f.read()
    except OSError:
        return None


def judge(run_dir: str, folder: str, world_size: int, nnodes: int, why: str) -> str:
    """The verdict line (with its `llmtrain: hang: ` prefix), also written to FOLDER/verdict.txt."""
    records = _by_rank(folder, "rank*.collectives.json", read_json)
    # A rank that failed (a collective timeout) wrote its trace as it exited; this launch's workers removed any
    # older one as they started.
    exited = _by_rank(RunPaths(run_dir).logs, "rank*.collectives.json", read_json)
    records.update({r: rec for r, rec in exited.items() if r not in records})
    stacks = _by_rank(folder, "rank*.stacks.txt", _text)
    answers = node_answers(folder, nnodes)
    states = {int(r): info.get("state") for a in answers.values() for r, info in a.get("ranks", {}).items()}
    silent = [n for n in range(nnodes) if n not in answers]
    said, culprits = verdict_and_culprits(records, stacks, world_size, lambda r: describe_rank(run_dir, r), states)
    line = "llmtrain: hang: " + said
    if silent:
        line += f"; node(s) {', '.join(map(str, silent))} did not answer (their agent is stopped or unreachable)"
    verdict = os.path.join(folder, "verdict.txt")
    try:
        with open(verdict, "w") as f:
            f.write(f"{line}\ndetected: {why}\n")
    except OSError as e:  # a full disk: the verdict is still said, and recorded in job.json if there is room
        warn_unwritten(verdict, e)
    places = read_places(run_dir)
    for host in dict.fromkeys(places.get(r, {}).get("host") for r in culprits):
        if host:  # the node ledger counts hangs per host (a host over its limit is left out of a requeue)
            record_node_event(run_dir, host, "hang", said)
    return line
