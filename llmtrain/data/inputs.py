"""Which files `llmtrain data prepare` reads, in which order: the inputs named on the command line, and the files
under the folders among them (sorted, filtered by --include/--exclude)."""

from __future__ import annotations

import fnmatch
import os
from typing import Iterable, Sequence

from .errors import DataError
from .prepare_options import InputUnit


def expand_inputs(
    inputs: Sequence[str], outputs: set[str], include: Sequence[str], exclude: Sequence[str]
) -> list[InputUnit]:
    """One unit per file, in command-line order; a directory contributes its matching
    regular files, sorted, recursively. `outputs` (the files being written) are never inputs."""
    if not inputs:
        raise DataError("--input", "no input given")
    files = []
    for given in inputs:
        given = os.fspath(given)
        path = os.path.abspath(os.path.expanduser(given))
        if os.path.isfile(path):
            found = [(path, given)]
        elif os.path.isdir(path):
            found = []
            for dirpath, dirnames, filenames in os.walk(path):
                rel_dir = os.path.relpath(dirpath, path)
                rel_dir = "" if rel_dir == "." else rel_dir.replace(os.sep, "/") + "/"
                dirnames[:] = [d for d in dirnames if not _matches(exclude, rel_dir + d, d)]
                for name in filenames:
                    rel = rel_dir + name
                    if include and not _matches(include, rel, name):
                        continue
                    if _matches(exclude, rel, name):
                        continue
                    full = os.path.join(dirpath, name)
                    if os.path.isfile(full):
                        found.append((full, os.path.join(given, rel)))
            found.sort()
        else:
            raise DataError("--input", f"no such file or directory: {given}")
        files.extend(f for f in found if f[0] not in outputs)
    if not files:
        what = "no files match --include/--exclude" if include or exclude else "no files found"
        raise DataError("--input", f"{what} in: {' '.join(map(str, inputs))}")
    return [InputUnit(path, name) for path, name in files]


def _matches(patterns: Iterable[str], rel: str, name: str) -> bool:
    return any(fnmatch.fnmatch(rel, p) or fnmatch.fnmatch(name, p) for p in patterns)
