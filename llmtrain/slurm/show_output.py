"""What `scontrol show job|partition` prints, as one dict of its text form's keys (JobState, Reason, NodeList,
NumNodes, Partition, Restarts, ExitCode, EndTime, ...): read from the Key=Value text, or from `--json` output with
its fields named and formatted as the text form has them, so callers read one shape whichever Slurm answered."""

from __future__ import annotations

import json
import re
import time

# A Key=Value token's key: letters first, then letters, digits, `_`, `:` and `/` (AllocNode:Sid=, CPUs/Task=).
KEY = re.compile(r"[A-Za-z][\w:/]*")
TEXT_TIME = "%Y-%m-%dT%H:%M:%S"
# JSON's job_state lists the base state and its flags; the text form shows the first flag of these, else the base.
STATE_FLAGS = ("COMPLETING", "STAGE_OUT", "CONFIGURING", "RESIZING", "REQUEUED", "REQUEUE_FED", "REQUEUE_HOLD",
               "SPECIAL_EXIT", "STOPPED", "RESV_DEL_HOLD")


def parse_text(text: str) -> dict[str, str]:
    """The Key=Value fields of scontrol's text output (the first of each key). A value runs to the next token that
    is a Key=Value, so a value with spaces (a job name, a command) is kept whole."""
    fields: dict[str, str] = {}
    current: str | None = None  # the key the following bare tokens belong to; None after a repeated key
    for token in text.split():
        key, eq, value = token.partition("=")
        if eq and KEY.fullmatch(key):
            current = key if key not in fields else None
            if current:
                fields[key] = value
        elif current:
            fields[current] += " " + token
    return fields


def _number(value) -> int | None:
    """An integer field: a plain number (data_parser v0.0.38) or {"set", "infinite", "number"} (later ones)."""
    if isinstance(value, dict):
        return int(value["number"]) if value.get("set", True) and not value.get("infinite") else None
    return int(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _state(value) -> str:
    if isinstance(value, list):
        flags = [s for s in STATE_FLAGS if s in value]
        return flags[0] if flags else (value[0] if value else "UNKNOWN")
    return str(value or "UNKNOWN")


def _exit_code(value) -> str:
    """"code:signal" from a wait status (v0.0.38) or {"return_code", "signal": {"id"}} (later ones)."""
    if isinstance(value, dict):
        code = _number(value.get("return_code")) or 0
        sig = _number((value.get("signal") or {}).get("id")) or 0
        return f"{code}:{sig}"
    status = _number(value)
    return "" if status is None else f"{(status >> 8) & 0xFF}:{status & 0x7F}"


def _end_time(value) -> str:
    seconds = _number(value)
    return time.strftime(TEXT_TIME, time.localtime(seconds)) if seconds else "Unknown"


def job_from_json(job: dict) -> dict[str, str]:
    """One job of `scontrol --json show job` in the text form's keys and formats."""
    nodes = job.get("nodes") or "(null)"
    count = _number(job.get("node_count"))
    return {
        "JobId": str(job.get("job_id", "")),
        "JobName": str(job.get("name", "")),
        "JobState": _state(job.get("job_state")),
        "Reason": str(job.get("state_reason") or "None"),
        "NodeList": nodes,
        "ExcNodeList": str(job.get("excluded_nodes") or "(null)"),
        "NumNodes": "" if count is None else str(count),
        "Partition": str(job.get("partition", "")),
        "Restarts": str(_number(job.get("restart_cnt")) or 0),
        "ExitCode": _exit_code(job.get("exit_code")),
        "EndTime": _end_time(job.get("end_time")),
    }


def parse_json(text: str) -> tuple[dict[str, str], bool] | None:
    """(the job's fields, whether the controller said it has no such job) from `scontrol --json show job ID`;
    None when the text is not scontrol's JSON (this Slurm has no --json)."""
    try:
        data = json.loads(text)
    except ValueError:
        return None
    if not isinstance(data, dict) or "jobs" not in data:
        return None
    if data["jobs"]:
        return job_from_json(data["jobs"][0]), False
    said = " ".join(str(e.get("description", e)) if isinstance(e, dict) else str(e) for e in data.get("errors", []))
    return {}, not said or "invalid job id" in said.lower()
