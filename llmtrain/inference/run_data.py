"""Where a checkpoint's training data is now, and what its meta files say about it: the token file or shard folder
of each source, taken from the identity meta.json recorded (an absolute path) or else from config.yaml (a path
relative to where the run was launched)."""

from __future__ import annotations

import json
import os

from llmtrain.data.errors import DataError
from llmtrain.data.mixture_config import source_names
from llmtrain.data.token_source import index_path
from llmtrain.data.tokenfile import meta_path, read_token_meta


def data_sources(cfg, ckpt_meta: dict) -> dict[str, str]:
    """{source name: token file or shard folder} of the run's data (data=mix: each source; data=memmap and
    stdlib: one, named after data.name); {} for data=synthetic."""
    data = cfg.data
    recorded = ckpt_meta.get("data") if isinstance(ckpt_meta.get("data"), dict) else {}
    if data.name == "mix":
        paths = (recorded.get("sources") or {}) if isinstance(recorded.get("sources"), dict) else {}
        return {name: _existing((paths.get(name) or {}).get("path"), str(entry["path"]))
                for name, entry in zip(source_names(data.sources), data.sources)}
    if data.name in ("memmap", "stdlib"):
        return {data.name: _existing(recorded.get("path"), str(data.path))}
    return {}


def _existing(recorded: str | None, configured: str) -> str:
    """The path the checkpoint recorded when it is still there, else the configured one."""
    if recorded and os.path.exists(recorded):
        return recorded
    return os.path.abspath(os.path.expanduser(configured))


def source_meta(path: str) -> dict | None:
    """What `llmtrain data prepare` wrote beside a source: FILE.json, or a shard folder's index.json; None when
    there is none."""
    if os.path.isdir(path):
        try:
            with open(index_path(path), encoding="utf-8") as f:
                index = json.load(f)
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as e:
            raise DataError("--tokenizer", f"cannot read {index_path(path)}: {e}") from None
        return index if isinstance(index, dict) else None
    return read_token_meta(path)


def meta_file(path: str) -> str:
    """The file source_meta reads for `path`."""
    return index_path(path) if os.path.isdir(path) else meta_path(path)
