"""logs/combined.log ([node/rank] prefixes, a separator per launch) and the one way ranks are named."""

from __future__ import annotations

import json
import re

from llmtrain.launch.supervision.combined_log import CombinedLog, combined_path
from llmtrain.launch.supervision.placement import describe_rank, node_label, rank_label


def _place(logs, rank: int, node: int, host: str, local_rank: int) -> None:
    (logs / f"rank{rank}.place").write_text(json.dumps({"rank": rank, "node": node, "host": host,
                                                         "local_rank": local_rank, "restart": 0}))


def test_rank_and_node_labels_have_one_format(tmp_path):
    assert rank_label(3, 1, "node2", 1) == "rank 3 (node 1, host node2, local rank 1)"
    assert rank_label(3, node=0) == "rank 3 (node 0)"
    assert rank_label(None, 1, "node2", 0) == "a rank (node 1, host node2, local rank 0)"
    assert node_label(1, "node2") == "node 1 (host node2)"
    logs = tmp_path / "logs"
    logs.mkdir()
    _place(logs, 3, 1, "node2", 1)
    # What the rank recorded wins over what the caller guessed (torchrun's summary may give another host form).
    assert describe_rank(str(tmp_path), 3, host="node2.cluster", local_rank=1, node=0) == \
        "rank 3 (node 1, host node2, local rank 1)"
    assert describe_rank(str(tmp_path), 4, host="node2", local_rank=0) == "rank 4 (host node2, local rank 0)"


def test_combined_log_prefixes_new_lines_and_separates_launches(tmp_path):
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "rank0.log").write_text("from an earlier launch\n")
    _place(logs, 0, 0, "node1", 0)
    _place(logs, 1, 1, "node2", 0)
    log = CombinedLog(str(tmp_path), header="launch 2")
    with open(logs / "rank0.log", "a") as f:
        f.write("step 1 | loss 5.0\nhalf a li")
    (logs / "rank1.log").write_text("rank one says\n")
    (logs / "rank2.log").write_text("no place yet\n")
    log.poll()
    with open(logs / "rank0.log", "a") as f:
        f.write("ne\n")
    log.poll()
    lines = open(combined_path(str(tmp_path))).read().splitlines()
    assert re.fullmatch(r"===== launch 2, \d{4}-\d\d-\d\d \d\d:\d\d:\d\d \S* =====", lines[0]), lines[0]
    assert lines[1:] == ["[0/0] step 1 | loss 5.0", "[1/1] rank one says", "[?/2] no place yet", "[0/0] half a line"]


def test_slurm_script_runs_the_merger_around_srun(tmp_path):
    from llmtrain.config import compose_config
    from llmtrain.launch.backends.slurm import SlurmBackend

    cfg = compose_config(["cluster=slurm", f"run.dir={tmp_path}", "cluster.nnodes=2"])
    script = SlurmBackend(cfg, str(tmp_path)).script().splitlines()
    start = next(i for i, line in enumerate(script) if "-m llmtrain.launch.supervision.combined_log" in line)
    srun = next(i for i, line in enumerate(script) if line.startswith("srun "))
    stop = script.index('kill "$notice" 2>/dev/null; kill -TERM "$merger"; wait "$merger"')
    notice = next(i for i, line in enumerate(script) if "-m llmtrain.launch.node.slurm_notice" in line)
    assert start < notice < srun < stop and script[start].endswith("& merger=$!")
    # The batch shell passes a USR1 on to the steps while srun runs, and the job's end it execs ignores one.
    assert script.index("trap forward_notice USR1") < srun < stop < script.index("trap '' USR1")
    assert script[-1].startswith('LLMTRAIN_HANG_WATCH="$hung" exec ') and script.index("trap '' USR1") < len(script) - 1


