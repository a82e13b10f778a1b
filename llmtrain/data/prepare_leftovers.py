"""What a killed `llmtrain data prepare` leaves beside its output, and removing it. Every temp file and folder a
prepare makes there is named after the process that owns it, `.OUT.prepare-PID-HOST.…` (the token file and meta
being written, the part files' folder, a shard folder being built, an old one being swapped out), so the next
prepare to the same output removes those whose owner is gone from this host (kill -9, out of memory, a reboot) and
leaves alone those of a prepare still running, here or on another host sharing the folder."""

from __future__ import annotations

import os
import re
import shutil
import socket

# Names of leftovers listed in the message; the rest are counted.
_LISTED = 3
# Temp names written before the owner was part of them (mkstemp/mkdtemp's 8 random characters).
_UNOWNED = r"(?:(?:\.json)?\.[a-z0-9_]{8}\.tmp|\.(?:parts|old)-[a-z0-9_]{8})"


def _host() -> str:
    return re.sub(r"[^A-Za-z0-9-]", "-", socket.gethostname()) or "host"


def owner_tag() -> str:
    """`prepare-PID-HOST`: what names this process's temp files and folders."""
    return f"prepare-{os.getpid()}-{_host()}"


def temp_prefix(path: str) -> str:
    """The start of the names of this process's temp files beside `path`: `.NAME.prepare-PID-HOST.`."""
    return f".{os.path.basename(path)}.{owner_tag()}."


def _owner_gone(pid: int, host: str) -> bool:
    if host != _host() or pid == os.getpid():
        return False  # another host's process cannot be asked; this one is running
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False  # alive, another user's
    return False


def _size(path: str) -> int:
    if os.path.islink(path) or not os.path.isdir(path):
        return os.lstat(path).st_size
    total = 0
    for folder, _, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(folder, name)).st_size
            except OSError:
                pass
    return total


def _remove(path: str) -> None:
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path, ignore_errors=True)
    else:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass


def _listed(paths: list[str], nbytes: int) -> str:
    shown = ", ".join(paths[:_LISTED]) + (f", +{len(paths) - _LISTED} more" if len(paths) > _LISTED else "")
    return f"{shown} ({nbytes / 1e6:,.1f} MB)"


def clean_leftovers(output: str) -> list[str]:
    """Remove the temp files and folders beside `output` (an absolute path) of prepares to it that are no longer
    running; returns what to tell the user: a line naming what was removed and its size, and one naming older temp
    names that record no owner (left in place: whether their prepare still runs cannot be known)."""
    folder, base = os.path.split(output)
    owned = re.compile(rf"\.{re.escape(base)}(?:\.json)?\.prepare-(\d+)-([A-Za-z0-9-]+)\.")
    unowned = re.compile(rf"\.{re.escape(base)}{_UNOWNED}")
    try:
        names = sorted(os.listdir(folder))
    except OSError:
        return []
    removed, removed_bytes, unknown, unknown_bytes = [], 0, [], 0
    for name in names:
        path = os.path.join(folder, name)
        match = owned.match(name)
        try:
            if match and _owner_gone(int(match.group(1)), match.group(2)):
                removed_bytes += _size(path)
                _remove(path)
                removed.append(path)
            elif not match and unowned.fullmatch(name):
                unknown_bytes += _size(path)
                unknown.append(path)
        except OSError:
            continue  # gone meanwhile, or unreadable: not ours to report
    notes = []
    if removed:
        notes.append(f"removed leftovers of an interrupted prepare: {_listed(removed, removed_bytes)}")
    if unknown:
        notes.append(f"left in place, from a prepare that did not record its process (remove them when no prepare "
                     f"of {output} is running): {_listed(unknown, unknown_bytes)}")
    return notes
