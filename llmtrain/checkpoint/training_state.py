"""TrainingState: what a run has done so far besides its weights and optimizer moments, as one DCP `Stateful`.

The trainer owns one and advances it every step; the checkpoint manager saves and restores it and never touches the
trainer. Its state_dict is the checkpoint's "extra" entry, with the keys every checkpoint has had: step,
samples_seen, tokens_seen, scaler (the loss scaler's state), and for data=mix the mixture's history of weights as
JSON text (mixture); once a loss spike was rolled back, the skipped sample ranges as JSON text (skipped, the entries
of rundir/spike_record.py). The training time is not in it: each checkpoint's meta.json records it (elapsed_s).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Protocol

from torch.distributed.checkpoint.stateful import Stateful


class MixtureHistory(Protocol):
    """The data feed's part of a checkpoint (train/data_feed.py): the mixture's segments, or None without one."""

    def state_text(self, samples_seen: int) -> str | None: ...

    def load_state_text(self, text: str, samples_seen: int) -> bool: ...


@dataclass
class TrainingState(Stateful):
    scaler: Stateful  # the loss scaler: its scale and overflow-free streak continue across a resume
    data: MixtureHistory | None = None
    step: int = 0  # optimizer steps taken (skipped ones included)
    samples_seen: int = 0  # position in the global sample stream
    tokens_seen: int = 0
    # Training time of earlier launches of this run (from the checkpoint), and when this launch's began.
    elapsed_before_s: float = 0.0
    segment_start: float = field(default_factory=time.perf_counter)
    # Set by load_state_dict: this run's data.sources weights differ from the checkpoint's, so a new mixture
    # segment starts at samples_seen.
    new_mixture_segment: bool = False
    # Loss-spike rollbacks so far (train/rollback.py): their skipped ranges go with every later checkpoint.
    skipped: list[dict] = field(default_factory=list)

    def elapsed_s(self) -> float:
        """Training time of the whole run so far, over every launch that led to this state."""
        return self.elapsed_before_s + time.perf_counter() - self.segment_start

    def restart_clock(self) -> None:
        """This launch's training starts now (set-up and the resume's load do not count)."""
        self.segment_start = time.perf_counter()

    def advance(self, samples: int, tokens: int) -> None:
        """One optimizer step of `samples` sequences holding `tokens` tokens."""
        self.step += 1
        self.samples_seen += samples
        self.tokens_seen += tokens

    def mixture_text(self) -> str | None:
        return self.data.state_text(self.samples_seen) if self.data is not None else None

    def state_dict(self, mixture: bool = True, skipped: bool | None = None) -> dict:
        """`mixture=False` leaves the mixture out: a load asks for it only when the checkpoint has one; `skipped`
        likewise (None: when there is any)."""
        out = {"step": self.step, "samples_seen": self.samples_seen, "tokens_seen": self.tokens_seen,
               "scaler": self.scaler.state_dict()}
        text = self.mixture_text() if mixture else None
        if text is not None:
            out["mixture"] = text
        if skipped or (skipped is None and self.skipped):
            out["skipped"] = json.dumps(self.skipped)
        return out

    def load_state_dict(self, state: dict) -> None:
        self.step = int(state["step"])
        self.samples_seen = int(state["samples_seen"])
        self.tokens_seen = int(state["tokens_seen"])
        self.scaler.load_state_dict(state["scaler"])
        self.skipped = json.loads(state["skipped"]) if state.get("skipped") else []
        self.new_mixture_segment = bool(state.get("mixture") is not None and self.data is not None
                                        and self.data.load_state_text(state["mixture"], self.samples_seen))
