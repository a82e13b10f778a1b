"""Linear + cross entropy over chunks of tokens, never holding the whole fp32 logits.

Forward computes, chunk by chunk, the logits (in the compute dtype, then fp32), the loss and at once the gradients
of the hidden states and of the head's weight (softmax minus one-hot, over the tokens counted), so only one chunk's
logits exist at a time; backward only scales the kept gradients. The FLOPs are those of the full-logits path
(forward matmul, two backward matmuls). With a tensor-parallel `group`, the weight is this rank's vocabulary shard
starting at `vocab_start`: the row maximum and the sums of exponentials and target logits are all-reduced, so the
loss is the whole vocabulary's and the hidden states' gradient is this shard's part (the caller sums it over tp).
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from llmtrain.model.head_loss import IGNORE_INDEX

class ChunkedLinearCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, weight, targets, chunk_tokens, group, vocab_start):
        """hidden (n, d) and weight (v, d) in the compute dtype, targets (n,); the mean loss over counted tokens."""
        needs_grad = ctx.needs_input_grad[0] or ctx.needs_input_grad[1]
        loss, grad_hidden, grad_weight = _chunks(hidden, weight, targets, chunk_tokens, group, vocab_start,
                                                 needs_grad)
        ctx.save_for_backward(grad_hidden, grad_weight)
        return loss

    @staticmethod
    def backward(ctx, grad_loss):
        grad_hidden, grad_weight = ctx.saved_tensors
        # Out of place: a schedule that splits backward (zero bubble) may call this twice on the same graph. The
        # fp32 scalar is not cast first: fp16's largest value is 65504, below a loss scale of 2^16.
        return grad_hidden * grad_loss, grad_weight * grad_loss, None, None, None, None


@torch.no_grad()
def _chunks(hidden, weight, targets, chunk_tokens, group, vocab_start, needs_grad):
    n, vocab = hidden.shape[0], weight.shape[0]
    counted = targets != IGNORE_INDEX
    count = counted.sum().clamp(min=1).float()
    local = targets - vocab_start
    here = counted & (local >= 0) & (local < vocab)  # targets in this rank's vocabulary shard
    local = torch.where(here, local, 0)
    total = torch.zeros((), dtype=torch.float32, device=hidden.device)
    grad_hidden = torch.empty_like(hidden) if needs_grad else hidden.new_empty(0)
    # Accumulated in place over the chunks (in the compute dtype, as Liger-Kernel does): no temporary of the
    # weight's size per chunk. In fp32 the result equals one big matmul's to rounding.
    grad_weight = torch.zeros_like(weight) if needs_grad else weight.new_empty(0)
    for start in range(0, n, chunk_tokens):
        rows = slice(start, min(n, start + chunk_tokens))
        h, tgt, hit, keep = hidden[rows], local[rows], here[rows], counted[rows]
        logits = (h @ weight.t()).float()
        row_max = logits.amax(dim=1)
        if group is not None:
            dist.all_reduce(row_max, op=dist.ReduceOp.MAX, group=group)
        target_logit = logits.gather(1, tgt[:, None]).squeeze(1) * hit
        probs = logits.sub_(row_max[:, None]).exp_()  # in place: the chunk's one fp32 buffer
        sums = torch.stack([probs.sum(dim=1), target_logit])
        if group is not None:
            dist.all_reduce(sums, group=group)
        total += ((sums[0].log() + row_max - sums[1]) * keep).sum()
        if not needs_grad:
            del logits, probs  # before the next chunk's logits are made: one chunk's buffer at a time
            continue
        probs.div_(sums[0][:, None])
        probs.scatter_add_(1, tgt[:, None], -hit[:, None].to(probs.dtype))  # minus one-hot; no host sync
        probs.mul_((keep / count)[:, None])  # d(mean loss)/d(logits)
        grad_logits = probs.to(hidden.dtype)
        torch.mm(grad_logits, weight, out=grad_hidden[rows])
        grad_weight.addmm_(grad_logits.t(), h)
        del logits, probs, grad_logits
    return total / count, grad_hidden, grad_weight
