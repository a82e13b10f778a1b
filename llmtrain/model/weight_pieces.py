"""Where a parameter of llmtrain's model is found in a weights file of another naming: the names every family
shares, and `Piece`, which a family's Hugging Face adapter (model/<family>/hf.py) returns for each stored tensor.

A Piece says where one llmtrain parameter, or one row of it, comes from: a stored tensor, maybe transposed (GPT-2's
Conv1D), maybe one of several equal row blocks of it (GPT-2's fused q/k/v), maybe one row of a parameter stacked
from several stored tensors (a mixture-of-experts layer stores each expert's matrices apart; llmtrain stacks them
into one [experts, ...] parameter). The same Piece gives the shape from a file header (the pre-launch check, no
tensor data read) and the tensor itself (the load), so both agree by construction.

No torch at import: the model layer is read by config code that must not import torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

if TYPE_CHECKING:
    import torch

EMBED = "embed.tok.weight"
POS = "embed.pos.weight"
HEAD = "head.weight"


@dataclass(frozen=True)
class Piece:
    name: str  # llmtrain parameter name
    key: str  # name of the stored tensor
    transpose: bool = False
    part: int = 0  # which of `parts` equal blocks along dim 0 (after transposing)
    parts: int = 1
    slot: int | None = None  # row `slot` of a stacked parameter (expert `slot`'s matrix); None: the whole one
    slots: int = 0  # the stack's rows where the adapter knows them; 0: the parameter's first dimension says

    @property
    def stacked(self) -> bool:
        return self.slot is not None

    def shape(self, stored: tuple[int, ...]) -> tuple[int, ...]:
        """The shape this piece fills: the whole parameter's, or one row's of a stacked one."""
        shape = tuple(reversed(stored)) if self.transpose and len(stored) == 2 else tuple(stored)
        if self.parts > 1 and shape and shape[0] % self.parts == 0:
            shape = (shape[0] // self.parts, *shape[1:])
        return shape  # a fused tensor that does not split evenly keeps its shape: the check reports it

    def take(self, stored: torch.Tensor) -> torch.Tensor:
        t = stored.t() if self.transpose and stored.dim() == 2 else stored
        return t.chunk(self.parts, dim=0)[self.part] if self.parts > 1 else t


def unstack(stacked: torch.Tensor, key_of: Callable[[int], str]) -> dict[str, torch.Tensor]:
    """A stacked parameter [E, ...] as E stored tensors {key_of(j): row j}: what an adapter's to_hf_state writes
    for the experts of a mixture-of-experts layer (the inverse of Pieces with slot=j)."""
    return {key_of(j): stacked[j] for j in range(stacked.shape[0])}
