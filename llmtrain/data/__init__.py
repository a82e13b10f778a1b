"""Token datasets, the layout-independent sample stream, and corpus preparation.

- `build_dataset(data_cfg, model_cfg, seed)` returns a `TokenDataset` (synthetic, memmap or stdlib).
- `get_batch(...)` / `SampleStream` map (step, micro_step, dp_rank) to a batch; the global order
  depends only on the seed and global batch size, so a run can resume under another DP layout.
- `prepare_corpus(...)` writes nanoGPT-style token files plus a `FILE.json` meta sidecar.
"""

from .corpus import ensure_stdlib_corpus, prepare_corpus, read_token_meta
from .datasets import MemmapDataset, SyntheticDataset, TokenDataset, build_dataset
from .errors import DataError
from .sampling import SampleStream, batch_indices, get_batch

__all__ = [
    "DataError",
    "MemmapDataset",
    "SampleStream",
    "SyntheticDataset",
    "TokenDataset",
    "batch_indices",
    "build_dataset",
    "ensure_stdlib_corpus",
    "get_batch",
    "prepare_corpus",
    "read_token_meta",
]
