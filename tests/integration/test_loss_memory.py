"""What the chunked loss saves, planned and measured: llama-tiny's block with Llama 3's 128,256-token vocabulary in
one process (fp32 on CPU), whose full logits dominate a micro-batch's memory."""

from __future__ import annotations

import pytest
from helpers.plan_memory_runs import bench_module, plan_here, train_here

LARGE_VOCAB = ["model=llama-tiny", "model.d_model=128", "model.seq_len=128", "model.vocab_size=128256",
               "train.micro_batch_size=2", "train.global_batch_size=4", "cluster.nproc_per_node=1"]


@pytest.mark.slow
def test_the_chunked_loss_drops_the_logits_share_of_the_peak_and_the_plan_knows(tmp_path):
    bench = bench_module()
    peaks = {}
    for loss in ("full", "chunked"):
        [row] = bench.compare(loss, [*LARGE_VOCAB, f"train.loss={loss}"], str(tmp_path), plan_here, train_here)
        assert abs(row["peak_pred"] / row["peak_meas"] - 1) <= 0.10, row
        assert abs(row["act_pred"] / row["act_meas"] - 1) <= 0.10, row
        peaks[loss] = row
    logits = 2 * 128 * 128256 * 4  # one micro-batch's fp32 logits
    planned = peaks["full"]["peak_pred"] - peaks["chunked"]["peak_pred"]
    measured = peaks["full"]["peak_meas"] - peaks["chunked"]["peak_meas"]
    # The full loss holds the fp32 log-softmax, and its backward starts with two more tensors of that size; the
    # chunked loss keeps the weight's gradient (128,256 x 128 x 4 bytes) and one chunk of logits instead.
    assert measured >= 1.5 * logits, (measured, logits)
    assert abs(planned / measured - 1) <= 0.10, (planned, measured)
