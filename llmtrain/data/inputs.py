"""Which files `llmtrain data prepare` reads, in which order: the inputs named on the command line, and the files
under the folders among them (sorted, filtered by --include/--exclude). Symlinks to files and folders alike are
followed; a symlink loop is not, and a file or folder reached twice is read once. A Hugging Face `datasets` folder
contributes its arrow files in its own order."""

from __future__ import annotations

import fnmatch
import os
from typing import Iterable, Sequence

from .errors import DataError
from .formats import input_format
from .hf_folders import dataset_arrow_files, is_dataset_folder
from .prepare_options import InputUnit

Found = tuple[str, str, str]  # (path opened, name shown, format)


def expand_inputs(
    inputs: Sequence[str], outputs: set[str], include: Sequence[str], exclude: Sequence[str]
) -> tuple[list[InputUnit], list[str]]:
    """One unit per file, in command-line order, and notes for the user (files read once, loops not followed,
    a DatasetDict's split order). A directory contributes its matching files, sorted, recursively.
    `outputs` (the files being written) are never inputs."""
    if not inputs:
        raise DataError("--input", "no input given")
    walker = _Walker(include, exclude)
    skip = {os.path.abspath(p) for p in outputs} | {i for i in map(_identity, outputs) if i is not None}
    first_name: dict[tuple, str] = {}
    units: list[InputUnit] = []
    for given in inputs:
        given = os.fspath(given)
        path = os.path.abspath(os.path.expanduser(given))
        if os.path.isdir(path):
            found = walker.walk(path, given)
        elif os.path.isfile(path):
            found = [(path, given, input_format(path))]
        else:
            raise DataError("--input", f"no such file or directory: {given}")
        for full, shown, fmt in found:
            identity = _identity(full) or full
            if full in skip or identity in skip:
                continue
            if identity in first_name:
                walker.notes.append(f"read once: {first_name[identity]} and {shown} are the same file")
                continue
            first_name[identity] = shown
            units.append(InputUnit(full, shown, fmt))
    if not units:
        what = "no files match --include/--exclude" if include or exclude else "no files found"
        raise DataError("--input", f"{what} in: {' '.join(map(str, inputs))}")
    return units, walker.notes


class _Walker:
    """Walks --input folders, following symlinks, each folder once."""

    def __init__(self, include: Sequence[str], exclude: Sequence[str]):
        self.include, self.exclude = include, exclude
        self.notes: list[str] = []
        self._folders: dict[tuple, str] = {}  # identity -> the name it was first reached by

    def walk(self, root: str, given: str) -> list[Found]:
        groups: list[tuple[str, list[Found]]] = []  # (sort key, files read together in this order)
        self._visit(root, given, "", groups, {})
        groups.sort(key=lambda group: group[0])  # full paths, as the files were always ordered
        return [f for _, files in groups for f in files]

    def _visit(self, folder: str, given: str, rel_dir: str, groups: list, ancestors: dict[tuple, str]) -> None:
        shown = os.path.join(given, rel_dir) if rel_dir else given
        identity = _identity(folder)
        if identity in ancestors:
            self.notes.append(f"symlink loop not followed: {shown} leads back to {ancestors[identity]}")
            return
        if identity in self._folders:
            self.notes.append(f"read once: {self._folders[identity]} and {shown} are the same folder")
            return
        self._folders[identity] = shown
        if is_dataset_folder(folder):
            files, notes = dataset_arrow_files(folder, shown)
            kept = [(full, name, "arrow") for full, name in files
                    if self._wanted(rel_dir + os.path.relpath(full, folder).replace(os.sep, "/"))]
            groups.append((folder + os.sep, kept))
            self.notes.extend(notes if kept else [])
            return
        try:
            names = sorted(os.listdir(folder))
        except OSError as e:
            self.notes.append(f"cannot read folder {shown}: {e.strerror or e}; skipped")
            return
        for name in names:
            full, rel = os.path.join(folder, name), rel_dir + name
            if os.path.isdir(full):
                if not _matches(self.exclude, rel, name):
                    self._visit(full, given, rel + "/", groups, {**ancestors, identity: shown})
            elif os.path.isfile(full):
                if self._wanted(rel):
                    groups.append((full, [(full, os.path.join(given, rel), input_format(full))]))
            elif os.path.islink(full) and self._wanted(rel):
                self.notes.append(f"broken symlink skipped: {os.path.join(given, rel)}")

    def _wanted(self, rel: str) -> bool:
        name = rel.rsplit("/", 1)[-1]
        if self.include and not _matches(self.include, rel, name):
            return False
        return not _matches(self.exclude, rel, name)


def _identity(path: str) -> tuple | None:
    """What tells one file from another whatever path reaches it (symlinks followed); None when it cannot be read."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def _matches(patterns: Iterable[str], rel: str, name: str) -> bool:
    return any(fnmatch.fnmatch(rel, p) or fnmatch.fnmatch(name, p) for p in patterns)
