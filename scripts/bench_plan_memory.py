"""`llmtrain plan`'s per-rank memory against what the workers measure, for several layouts on CPU.

Measured per rank (written by each worker to logs/rank{R}.status): bytes of its parameter, gradient and AdamW-state
shards, the bytes autograd saved for backward during one micro-batch (a saved-tensor hook; parameters excluded), and
the peak of live tensor bytes over the first two steps (`profile.memory=true`: the CPU allocator's events recorded
by torch.profiler). Predicted: the same quantities from `llmtrain plan` for the same config. Run:
    python scripts/bench_plan_memory.py [--workdir DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile

MODEL = ["model.n_layers=4", "model.d_model=256", "model.n_heads=4", "model.seq_len=512", "train.micro_batch_size=4",
         "train.max_steps=2", "train.eval_interval=0", "checkpoint.at_end=false", "data=synthetic", "hardware=cpu",
         "profile.memory=true"]
SPARSE_EVERY_2 = ("model.moe={n_experts:4,top_k:2,expert_ffn_dim:null,n_shared_experts:0,norm_topk_prob:false,"
                  "router_aux_loss_coef:0.0,router_z_loss_coef:0.0,n_dense_layers:1,sparse_every:2}")
LAYOUTS = {
    "1 process": ["cluster.nproc_per_node=1"],
    "dp2 zero=3": ["cluster.nproc_per_node=2", "parallel.zero=3"],
    "dp2 zero=2": ["cluster.nproc_per_node=2", "parallel.zero=2"],
    "tp2": ["cluster.nproc_per_node=2", "parallel.tp=2"],
    "tp2 +sp": ["cluster.nproc_per_node=2", "parallel.tp=2", "parallel.sequence_parallel=true"],
    "recompute=full": ["cluster.nproc_per_node=1", "recompute=full"],
    "pp2 1f1b": ["cluster.nproc_per_node=2", "parallel.pp=2", "train.global_batch_size=8"],
    # The Llama block at the same size (4 query heads, 2 key/value heads, MLP width 704); pp2 with an untied head.
    "llama 1 process": ["model=llama-tiny", "cluster.nproc_per_node=1"],
    "llama selective": ["model=llama-tiny", "cluster.nproc_per_node=1", "recompute=selective"],
    "llama recompute=full": ["model=llama-tiny", "cluster.nproc_per_node=1", "recompute=full"],
    "llama dp2 zero=3": ["model=llama-tiny", "cluster.nproc_per_node=2", "parallel.zero=3"],
    "llama tp2 +sp": ["model=llama-tiny", "cluster.nproc_per_node=2", "parallel.tp=2", "parallel.sequence_parallel=true"],
    "llama pp2 1f1b untied": ["model=llama-tiny", "model.tie_embeddings=false", "cluster.nproc_per_node=2",
                              "parallel.pp=2", "train.global_batch_size=8"],
    # Mixtures of experts: moe-tiny (Qwen3's block: q/k norms; layer 0 dense, 1-3 sparse, 8 experts of width 64,
    # 2 per token, a shared expert) at d_model 256; and with 4 experts as wide as its dense MLP (384) on layers 1
    # and 3 only (sparse_every=2), no shared expert, no auxiliary loss.
    "moe-tiny 1 process": ["model=moe-tiny", "cluster.nproc_per_node=1"],
    "moe-tiny tp2 +sp": ["model=moe-tiny", "cluster.nproc_per_node=2", "parallel.tp=2",
                         "parallel.sequence_parallel=true"],
    "moe every 2nd 1 process": ["model=moe-tiny", SPARSE_EVERY_2, "cluster.nproc_per_node=1"],
    "moe every 2nd dp2 zero=3": ["model=moe-tiny", SPARSE_EVERY_2, "cluster.nproc_per_node=2", "parallel.zero=3"],
}
# Context parallel: llama-tiny's block at seq 1024, where activations dominate; cp ranks share each sample (2 and 4
# processes). Launched by `--cp` only (tests/integration/test_plan_cli.py holds the cp2 row to 10%).
CP_SEQ = ["model=llama-tiny", "model.seq_len=1024"]
CP_LAYOUTS = {
    "llama seq1024 cp1": [*CP_SEQ, "cluster.nproc_per_node=1"],
    "llama seq1024 cp2": [*CP_SEQ, "cluster.nproc_per_node=2", "parallel.cp=2"],
    "llama seq1024 cp4": [*CP_SEQ, "cluster.nproc_per_node=4", "parallel.cp=4"],
}
# Printed, not held to 10%: their peaks are small (~55 MiB) and have landed within 10% but up to 9% off, and a run's
# measured peak can read a few MiB high (a free on a collective's thread goes unrecorded unless its address is
# reused), which would make a test of them flaky.
NEAR_EDGE = {
    "tp2 recompute=full": ["cluster.nproc_per_node=2", "parallel.tp=2", "recompute=full"],
    "tp2 +sp, recompute=full": ["cluster.nproc_per_node=2", "parallel.tp=2", "parallel.sequence_parallel=true",
                                "recompute=full"],
}


def predicted(overrides: list[str]) -> dict:
    out = subprocess.run([sys.executable, "-m", "llmtrain", "plan", *overrides, "--json"], capture_output=True,
                         text=True, check=False)
    return json.loads(out.stdout)


def launched(run_dir: str, overrides: list[str]) -> None:
    subprocess.run([sys.executable, "-m", "llmtrain", "launch", f"run.dir={run_dir}", *overrides], check=True,
                   capture_output=True, env=dict(os.environ, OMP_NUM_THREADS="1"))


def measured(run_dir: str, overrides: list[str], train=launched) -> list[dict]:
    """Each rank's measured bytes after `train(run_dir, overrides)` trained the run."""
    train(run_dir, overrides)
    logs = os.path.join(run_dir, "logs")
    ranks = sorted(int(n[4:-7]) for n in os.listdir(logs) if n.endswith(".status"))
    return [json.load(open(os.path.join(logs, f"rank{r}.status")))["state_bytes"] for r in ranks]


def compare(name: str, overrides: list[str], workdir: str, plan_of=predicted, train=launched) -> list[dict]:
    """One row per rank: predicted and measured state and activation bytes. `plan_of` and `train` default to the
    CLI (`llmtrain plan --json`, `llmtrain launch`); the test passes in-process ones."""
    plan = plan_of(MODEL + overrides)
    rows = []
    pp = plan["dims"]["pp"]
    run_dir = os.path.join(workdir, re.sub(r"[^A-Za-z0-9_-]+", "_", name))
    for rank, got in enumerate(measured(run_dir, MODEL + overrides, train)):
        stage = plan["stages"][(rank // plan["dims"]["tp"]) % pp if pp > 1 else 0]
        state = stage["state_bytes"]
        want_state = state["params"] + state["grads"] + state["optimizer"]
        got_state = got["params"] + got["grads"] + got["optimizer"]
        row = {"layout": name, "rank": rank, "state_pred": want_state, "state_meas": got_state,
               "peak_pred": stage["peak_bytes"], "peak_meas": got["peak"]}
        if pp == 1 and plan["dims"]["zero"] == 0:  # one micro-batch in flight
            # FSDP2's unsharded copies (zero 0 over dp x cp > 1 ranks) are saved for backward too
            row.update(act_pred=stage["activation_bytes"] + state["gathered_params"], act_meas=got["activations"])
        rows.append(row)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--workdir", default=None)
    parser.add_argument("--cp", action="store_true", help="only the context-parallel layouts (CP_LAYOUTS)")
    args = parser.parse_args()
    workdir = args.workdir or tempfile.mkdtemp(prefix="llmtrain-plan-bench-")
    shape = "Llama (llama-tiny's block) 4 x 256, seq 1024" if args.cp else \
        "GPT-2, Llama (llama-tiny's block) and mixtures of experts (moe-tiny's) 4 x 256, seq 512"
    print(f"{shape}, micro-batch 4, fp32; MiB per rank (predicted / measured / error); peak: steps 1-2")
    print(f"{'layout':<26}{'rank':>5}{'state':>30}{'activations (1 micro-batch)':>36}{'peak':>30}")
    rows = CP_LAYOUTS.items() if args.cp else [*LAYOUTS.items(), *((f"{k} (*)", v) for k, v in NEAR_EDGE.items())]
    for name, overrides in rows:
        for r in compare(name, overrides, workdir):
            state = (f"{r['state_pred'] / 2**20:8.2f} / {r['state_meas'] / 2**20:8.2f} / "
                     f"{r['state_pred'] / r['state_meas'] - 1:+6.1%}")
            act = (f"{r['act_pred'] / 2**20:8.1f} / {r['act_meas'] / 2**20:8.1f} / "
                   f"{r['act_pred'] / r['act_meas'] - 1:+6.1%}" if "act_pred" in r else "-")
            peak = (f"{r['peak_pred'] / 2**20:8.1f} / {r['peak_meas'] / 2**20:8.1f} / "
                    f"{r['peak_pred'] / r['peak_meas'] - 1:+6.1%}")
            print(f"{name:<26}{r['rank']:>5}{state:>30}{act:>36}{peak:>30}", flush=True)
    if not args.cp:
        print("(*) not held to 10% by the test: see NEAR_EDGE in this script")


if __name__ == "__main__":
    main()
