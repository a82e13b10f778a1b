"""Every call llmtrain makes to Slurm's commands. Each has a timeout, so a slow controller delays its caller and
never hangs it; a missing command or one that did not answer is an answer of its own (None, or a one-line reason),
never an exception, except for sbatch, whose caller tells the two apart.

`scontrol show job` is asked with --json where this Slurm has it (tried on the first call, remembered per scontrol
program) and read from its Key=Value text otherwise; both come back as the text form's fields (show_output.py).
"""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass

from llmtrain.slurm.show_output import parse_json, parse_text

# Whether each scontrol program (by path) answered `--json show job` with JSON.
_JSON_WORKS: dict[str | None, bool] = {}


@dataclass(frozen=True)
class JobAnswer:
    fields: dict[str, str]  # the job's fields; {} when the answer named no job
    unknown: bool  # the controller said it has no such job (it ended and was purged, or never existed)


def run(argv: list[str], timeout: float) -> subprocess.CompletedProcess | None:
    """Run a Slurm command; None when it is not on PATH or did not answer within `timeout` seconds."""
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired):
        return None


def last_line(out: subprocess.CompletedProcess) -> str:
    """What a failed command said last, or its exit code when it said nothing."""
    lines = (out.stderr or out.stdout or "").strip().splitlines()
    return lines[-1].strip() if lines else f"exit code {out.returncode}"


def show_job(job_id: str, timeout: float = 30) -> JobAnswer | None:
    """The job as `scontrol show job` shows it; None when scontrol is not here or did not answer."""
    program = shutil.which("scontrol")
    if _JSON_WORKS.get(program, True):
        out = run(["scontrol", "--json", "show", "job", str(job_id)], timeout)
        if out is None:
            return None
        parsed = parse_json(out.stdout)
        _JSON_WORKS[program] = parsed is not None
        if parsed is not None:
            return JobAnswer(*parsed)
    out = run(["scontrol", "show", "job", str(job_id)], timeout)
    if out is None:
        return None
    fields = parse_text(out.stdout)
    return JobAnswer(fields, "JobState" not in fields and "invalid job id" in (out.stderr + out.stdout).lower())


def show_partition(name: str, timeout: float = 30) -> dict[str, str] | None:
    """The partition's fields from `scontrol show partition`; None when it cannot be told."""
    out = run(["scontrol", "show", "partition", name], timeout)
    fields = parse_text(out.stdout) if out is not None and out.returncode == 0 else {}
    return fields if "PartitionName" in fields else None


def hostnames(nodelist: str, timeout: float = 30) -> list[str] | None:
    """node[1-2] -> [node1, node2], as scontrol expands it; None when it did not."""
    out = run(["scontrol", "show", "hostnames", nodelist], timeout)
    names = out.stdout.split() if out is not None and out.returncode == 0 else []
    return names or None


def requeue(job_id: str, timeout: float = 60) -> str | None:
    """`scontrol requeue`; None when Slurm took it, else why not."""
    out = run(["scontrol", "requeue", str(job_id)], timeout)
    if out is None:
        return f"scontrol requeue did not run or answer within {timeout:g} s"
    return None if out.returncode == 0 else last_line(out)


def update_job(job_id: str, *fields: str, timeout: float = 60) -> str | None:
    """`scontrol update JobId=ID FIELD=VALUE...`; None when Slurm took it, else why not."""
    out = run(["scontrol", "update", f"JobId={job_id}", *fields], timeout)
    if out is None:
        return f"scontrol update did not run or answer within {timeout:g} s"
    return None if out.returncode == 0 else last_line(out)


def cancel(*args: str, timeout: float = 60) -> str | None:
    """`scancel ARGS`; None when it worked, else what went wrong, in one line."""
    try:
        out = subprocess.run(["scancel", *args], capture_output=True, text=True, timeout=timeout)
    except OSError:
        return "scancel is not on PATH on this node"
    except subprocess.TimeoutExpired:
        return f"scancel did not answer within {timeout:g} s"
    return None if out.returncode == 0 else last_line(out)


def job_steps(job_id: str, timeout: float = 30) -> list[str] | None:
    """The job's running steps that srun started (`12.0`, `12.1`: not its batch or extern step), as squeue lists
    them; None when squeue did not run or answer."""
    out = run(["squeue", "--noheader", "--steps", f"--jobs={job_id}", "--format=%i"], timeout)
    if out is None or out.returncode != 0:
        return None
    return [step for step in out.stdout.split() if step.rpartition(".")[2].isdigit()]


def sinfo(args: list[str], timeout: float) -> tuple[str | None, str | None]:
    """(sinfo's output, None), or (None, why it gave none)."""
    try:
        out = subprocess.run(["sinfo", *args], capture_output=True, text=True, timeout=timeout)
    except OSError:
        return None, "sinfo is not on PATH"
    except subprocess.TimeoutExpired:
        return None, f"sinfo did not answer within {timeout:g} s"
    if out.returncode != 0:
        said = (out.stderr or out.stdout).strip().splitlines()
        return None, f"sinfo failed: {said[-1] if said else f'exit code {out.returncode}'}"
    return out.stdout, None


def submit(script: str, timeout: float, hold: bool = False) -> subprocess.CompletedProcess:
    """`sbatch --parsable SCRIPT` (`hold`: held until released). Raises FileNotFoundError (no sbatch) or
    subprocess.TimeoutExpired: whether a job was submitted is then not known, which the caller says."""
    return subprocess.run(["sbatch", "--parsable", *(["--hold"] if hold else []), script], capture_output=True,
                          text=True, timeout=timeout)


def release(job_id: str, timeout: float = 60) -> str | None:
    """`scontrol release`; None when Slurm took it, else why not."""
    out = run(["scontrol", "release", str(job_id)], timeout)
    if out is None:
        return f"scontrol release did not run or answer within {timeout:g} s"
    return None if out.returncode == 0 else last_line(out)
