"""Choosing each next token: greedy (temperature 0) or sampled from softmax(logits / temperature), kept to the k
most likely (top-k) and to the smallest set holding probability top-p (nucleus), in that order. The model has no
KV cache: each step runs the model over the last model.seq_len tokens again."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from llmtrain.errors import ConfigError

EOT, MAX_NEW_TOKENS = "eot", "max_new_tokens"  # why generation stopped


@dataclass(frozen=True)
class SamplingOptions:
    max_new_tokens: int = 200
    temperature: float = 1.0
    top_k: int | None = None
    top_p: float | None = None
    seed: int = 0

    def check(self) -> None:
        if self.max_new_tokens < 1:
            raise ConfigError("--max-new-tokens", f"must be >= 1, got {self.max_new_tokens}")
        if not self.temperature >= 0 or self.temperature == float("inf"):
            raise ConfigError("--temperature", f"must be >= 0 (0: greedy), got {self.temperature}")
        if self.top_k is not None and self.top_k < 1:
            raise ConfigError("--top-k", f"must be >= 1, got {self.top_k}")
        if self.top_p is not None and not 0 < self.top_p <= 1:
            raise ConfigError("--top-p", f"must be in (0, 1], got {self.top_p}")


@dataclass
class Generation:
    new_ids: list[int] = field(default_factory=list)  # the tokens generated, the end-of-text token included
    stopped: str = MAX_NEW_TOKENS
    seconds: float = 0.0


def next_token(logits: torch.Tensor, options: SamplingOptions, generator: torch.Generator) -> int:
    """The next token id from one position's logits (vocab,)."""
    logits = logits.float()
    if options.temperature == 0:
        return int(torch.argmax(logits))
    logits = logits / options.temperature
    if options.top_k is not None and options.top_k < logits.numel():
        kth = torch.topk(logits, options.top_k).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if options.top_p is not None and options.top_p < 1:
        probs, order = torch.sort(torch.softmax(logits, dim=-1), descending=True)
        # Drop a token once the more likely ones before it already hold top_p; the most likely always stays.
        drop = torch.cumsum(probs, dim=-1) - probs >= options.top_p
        logits = logits.masked_fill(torch.zeros_like(drop).scatter(0, order, drop), float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    return int(torch.multinomial(probs.cpu(), 1, generator=generator))


@torch.inference_mode()
def generate(model: torch.nn.Module, prompt_ids: list[int], vocab_size: int, seq_len: int,
             options: SamplingOptions, eot_id: int | None, device: torch.device) -> Generation:
    """Extend `prompt_ids` by up to options.max_new_tokens tokens, stopping after `eot_id`. Each step runs the
    model's forward over the last `seq_len` tokens and picks from the real vocabulary (the embedding's padding
    rows are never chosen). Sampling draws on the CPU from `options.seed`, so a seed gives the same tokens on
    any device (for the same logits)."""
    generator = torch.Generator().manual_seed(options.seed)
    ids = torch.tensor([prompt_ids], dtype=torch.long, device=device)
    result = Generation()
    start = time.perf_counter()
    for _ in range(options.max_new_tokens):
        logits = model(ids[:, -seq_len:])[0, -1, :vocab_size]
        token = next_token(logits, options, generator)
        result.new_ids.append(token)
        ids = torch.cat([ids, torch.tensor([[token]], dtype=torch.long, device=device)], dim=1)
        if token == eot_id:
            result.stopped = EOT
            break
    result.seconds = time.perf_counter() - start
    return result
