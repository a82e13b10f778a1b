"""Hugging Face `datasets` folders made by `save_to_disk`: a Dataset folder (`state.json`, `dataset_info.json` and
`data-*.arrow` files) or a DatasetDict folder (`dataset_dict.json` and one Dataset folder per split). Only their
JSON is read here; the arrow files are read with pyarrow (table_input.py), so the `datasets` package is not needed."""

from __future__ import annotations

import glob
import json
import os

from .errors import DataError


def is_dataset_folder(path: str) -> bool:
    return os.path.isfile(os.path.join(path, "dataset_dict.json")) or (
        os.path.isfile(os.path.join(path, "state.json")) and os.path.isfile(os.path.join(path, "dataset_info.json")))


def dataset_arrow_files(path: str, name: str) -> tuple[list[tuple[str, str]], list[str]]:
    """(full path, name for messages) of the folder's arrow files in reading order, and notes saying what that
    order is. A DatasetDict's splits are read in the order its dataset_dict.json lists them."""
    dict_file = os.path.join(path, "dataset_dict.json")
    if not os.path.isfile(dict_file):
        return _split_files(path, name), []
    splits = _read_json(dict_file, name).get("splits")
    if not isinstance(splits, list) or not all(isinstance(s, str) for s in splits):
        raise DataError("--input", f"{os.path.join(name, 'dataset_dict.json')}: no list of split names in 'splits'")
    files = []
    for split in splits:
        files += _split_files(os.path.join(path, split), os.path.join(name, split))
    note = f"{name}: a datasets DatasetDict; its splits are read in the order dataset_dict.json lists them: " \
           f"{', '.join(splits)}"
    return files, [note]


def _split_files(path: str, name: str) -> list[tuple[str, str]]:
    """A Dataset folder's arrow files in the order its state.json lists them (sorted data-*.arrow without one)."""
    state_file = os.path.join(path, "state.json")
    if not os.path.isfile(state_file):
        raise DataError("--input", f"{name}: not a datasets folder (no state.json)")
    listed = _read_json(state_file, name).get("_data_files")
    if isinstance(listed, list) and all(isinstance(f, dict) and "filename" in f for f in listed):
        names = [f["filename"] for f in listed]
    else:
        names = sorted(os.path.basename(f) for f in glob.glob(os.path.join(glob.escape(path), "data-*.arrow")))
    files = [(os.path.join(path, f), os.path.join(name, f)) for f in names]
    missing = [shown for full, shown in files if not os.path.isfile(full)]
    if missing:
        raise DataError("--input", f"{missing[0]}: listed in {os.path.join(name, 'state.json')} but missing")
    return files


def _read_json(path: str, name: str) -> dict:
    try:
        with open(path, "rb") as f:
            value = json.load(f)
    except (OSError, ValueError) as e:
        raise DataError("--input", f"cannot read {os.path.join(name, os.path.basename(path))}: {e}") from None
    if not isinstance(value, dict):
        raise DataError("--input", f"{os.path.join(name, os.path.basename(path))}: not a JSON object")
    return value
