"""Token datasets, the layout-independent sample stream, and corpus preparation.

- `build_dataset(data_cfg, model_cfg, seed)` returns a `TokenDataset` (synthetic, memmap or stdlib).
- `get_batch(...)` / `SampleStream` map (step, micro_step, dp_rank) to a batch; the global order
  depends only on the seed and global batch size, so a run can resume under another DP layout.
- `prepare_corpus(...)` writes nanoGPT-style token files plus a `FILE.json` meta sidecar.
- `check_token_file(...)` checks a token file against the run (vocab, dtype, sizes) from its size
  and meta alone, without torch: the launcher's config validation calls it, and the workers'
  datasets run the same checks from llmtrain.data.tokenfile.
"""

import importlib

# Loaded on first use: the CLI needs DataError and the prepare arguments without paying for `import torch`.
_HOME = {
    "ensure_stdlib_corpus": "corpus", "prepare_corpus": "corpus", "read_token_meta": "tokenfile",
    "check_token_file": "tokenfile", "inspect_token_file": "tokenfile",
    "MemmapDataset": "datasets", "SyntheticDataset": "datasets", "TokenDataset": "datasets",
    "build_dataset": "datasets", "DataError": "errors", "SampleStream": "sampling", "batch_indices": "sampling",
    "get_batch": "sampling",
}


def __getattr__(name: str):
    if name in _HOME:
        return getattr(importlib.import_module(f"{__name__}.{_HOME[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "DataError",
    "MemmapDataset",
    "SampleStream",
    "SyntheticDataset",
    "TokenDataset",
    "batch_indices",
    "build_dataset",
    "check_token_file",
    "ensure_stdlib_corpus",
    "get_batch",
    "inspect_token_file",
    "prepare_corpus",
    "read_token_meta",
]
