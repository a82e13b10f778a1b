"""Lines of the sbatch script that Slurm and the batch shell read themselves: values quoted for #SBATCH lines, and
the batch shell's handling of a preemption notice. slurm.py renders the rest of the script."""

from __future__ import annotations

import shlex

from llmtrain.config.errors import ConfigError
from llmtrain.launch.shape.check import elastic, min_nnodes
from llmtrain.rundir.paths import RunPaths

# A USR1 to the batch shell (`--signal=B:USR1@N` in cluster.sbatch_extra, `scancel --batch --signal=USR1`) is a
# preemption notice: passed on to the job's steps, as the time-limit notice is (slurm_notice.py), and remembered
# for the job's end, which then requeues the job. The shell itself lives on: without a trap, USR1 kills bash.
# `wait` returns early (128 + 10) when the trap ran while the step still runs: step_status waits again.
NOTICE_TRAP = [
    "noticed=0 interrupted=0",
    "forward_notice() {",
    "  noticed=1 interrupted=1",
    '  echo "llmtrain: preemption notice (USR1 to the batch shell): passed on to the job\'s steps"',
    '  scancel --signal=USR1 "$SLURM_JOB_ID" || true',
    "}",
    "trap forward_notice USR1",
    "step_status() {  # srun's exit status",
    "  local rc=0 last",
    "  while :; do",
    '    interrupted=0; wait "$1"; last=$?',
    '    [ "$last" = 127 ] && return "$rc"  # already reported, to the wait the trap cut short',
    "    rc=$last",
    '    { [ "$interrupted" = 1 ] && [ "$rc" -gt 128 ]; } || return "$rc"',
    "  done",
    "}",
]


def sbatch_quoted(value: str, key: str) -> str:
    """A value as an #SBATCH line takes it: in double quotes (a space would end it). sbatch has no escape for `"` or
    a line break: refused, naming the key it came from."""
    if '"' in value or "\n" in value:
        raise ConfigError(key, f"{value!r} holds a double quote or a line break, which an #SBATCH line cannot "
                               f"carry: change {key}")
    return f'"{value}"'


def output_path(run_dir: str) -> str:
    """The job's log, RUN_DIR/logs/slurm-JOBID.out, for --output: `%` in run.dir doubled (sbatch reads `%j`-style
    patterns there)."""
    return sbatch_quoted(RunPaths(run_dir.replace("%", "%%")).slurm_output("%j"), "run.dir")


def node_options(cfg) -> list[str]:
    """sbatch's --nodes: cluster.nnodes, or MIN-MAX for a run that accepts fewer (cluster.min_nnodes), which also
    keeps its allocation when a node fails (--no-kill): the job's end then requeues it onto the healthy nodes."""
    if not elastic(cfg):
        return [f"#SBATCH --nodes={cfg.cluster.nnodes}"]
    return [f"#SBATCH --nodes={min_nnodes(cfg)}-{cfg.cluster.nnodes}", "#SBATCH --no-kill"]


def start_nodes(cfg) -> str:
    """The nodes a start runs on: cluster.nnodes, or for a run that accepts fewer, what Slurm granted (the batch
    shell expands it)."""
    return "${SLURM_NNODES}" if elastic(cfg) else str(cfg.cluster.nnodes)


# Words of the script that the batch shell expands (the job's node count, head node and id).
EXPANDED = ("${SLURM_NNODES}", "${head}", "${SLURM_JOB_ID}")


def shell_words(argv: list[str]) -> str:
    """argv as shell text: each word quoted, those holding one of EXPANDED's variables in double quotes, so the
    batch shell fills them in."""
    return " ".join(f'"{a}"' if any(v in a for v in EXPANDED) else shlex.quote(a) for a in argv)
