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
    def forward(ctx, hidden, weight, targets, chunk_tokens, group, vocab_start, needs_grad):
        """hidden (n, d) and weight (v, d) in the compute dtype, targets (n,); the mean loss over counted tokens.
        `needs_grad`: make the gradients (not in evaluation, whatever the tensors' requires_grad)."""
        loss, grad_hidden, grad_weight = _chunks(hidden, weight, targets, chunk_tokens, group, vocab_start,
                                                 needs_grad)
        ctx.save_for_backward(grad_hidden, grad_weight)
        ctx.dtypes = hidden.dtype, weight.dtype
        return loss

    @staticmethod
    def backward(ctx, grad_loss):
        grad_hidden, grad_weight = ctx.saved_tensors
        # Out of place: a schedule that splits backward (zero bubble) may call this twice on the same graph. fp16's
        # gradients are kept in fp32 and scaled there (a loss scale of 2^16 is more than fp16 holds), then cast.
        hidden_dtype, weight_dtype = ctx.dtypes
        return ((grad_hidden * grad_loss).to(hidden_dtype), (grad_weight * grad_loss).to(weight_dtype),
                None, None, None, None, None)


@torch.no_grad()
def _chunks(hidden, weight, targets, chunk_tokens, group, vocab_start, needs_grad):
    n, vocab = hidden.shape[0], weight.shape[0]
    counted = targets != IGNORE_INDEX
    count = counted.sum().clamp(min=1).float()
    local = targets - vocab_start
    here = counted & (local >= 0) & (local < vocab)  # targets in this rank's vocabulary shard
    local = torch.where(here, local, 0)
    total = torch.zeros((), dtype=torch.float32, device=hidden.device)
    # The gradients are summed unnormalised (softmax minus one-hot, each entry within [-1, 1], so none underflows
    # in fp16) and divided by the token count once at the end. fp16 accumulates in fp32: a weight row's sum over
    # the tokens can pass fp16's 65504. bf16 and fp32 accumulate in place in their own dtype (as Liger-Kernel
    # does): no temporary of the weight's size per chunk.
    keep_dtype = torch.float32 if hidden.dtype == torch.float16 else hidden.dtype
    grad_hidden = torch.empty(hidden.shape, dtype=keep_dtype, device=hidden.device) if needs_grad \
        else hidden.new_empty(0)
    grad_weight = torch.zeros(weight.shape, dtype=keep_dtype, device=weight.device) if needs_grad \
        else weight.new_empty(0)
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
        probs.mul_(keep[:, None])  # ignored tokens add nothing
        grad_logits = probs.to(hidden.dtype)
        if keep_dtype == hidden.dtype:
            torch.mm(grad_logits, weight, out=grad_hidden[rows])
            grad_weight.addmm_(grad_logits.t(), h)
        else:
            grad_hidden[rows] = grad_logits @ weight
            grad_weight += grad_logits.t() @ h
        del logits, probs, grad_logits
    if needs_grad:
        grad_hidden.div_(count)
        grad_weight.div_(count)
    return total / count, grad_hidden, grad_weight
