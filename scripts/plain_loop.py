"""The reference for llmtrain's throughput: the same model trained by a plain PyTorch loop in one process.

Takes the same config overrides as `llmtrain launch` and builds the same thing without llmtrain's trainer:
the configured model (`llmtrain.model.build_model`: GPT-2 or Llama) initialized by `init_parameters`, the same batches (`SampleStream`), autocast in the
configured compute dtype, fp32 cross entropy, gradient accumulation over global / micro batches, clipping, the
warmup + cosine learning rate and AdamW (torch's fused kernel unless --no-fused; train.compile=true compiles each
block as llmtrain does). Writes one JSON object to --out (and stdout): per-step times, the median tokens/s over the
steps after --skip, the peak memory (CUDA max allocated), and the losses.

  python scripts/plain_loop.py [--steps 15] [--skip 5] [--out FILE] OVERRIDES...
  e.g. model=gpt-1.3b precision=bf16 device=cuda data=synthetic train.micro_batch_size=4 train.global_batch_size=8
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's llmtrain


def train(cfg, steps: int, fused: bool) -> dict:
    import torch
    import torch.nn.functional as F

    from llmtrain.data import SampleStream, build_dataset
    from llmtrain.model import build_model, init_parameters
    from llmtrain.train.optim import lr_at

    cuda = cfg.device == "cuda" or (cfg.device == "auto" and torch.cuda.is_available())
    device = torch.device("cuda" if cuda else "cpu")
    m, t = cfg.model, cfg.train
    dtype = {"float32": None, "bfloat16": torch.bfloat16, "float16": torch.float16}[cfg.precision.compute_dtype]
    torch.manual_seed(t.seed)
    with torch.device("meta"):  # materialized on the device, then initialized there, as llmtrain does
        model = build_model(m)
    model.to_empty(device=device)
    model.tie_weights()
    init_parameters(model, t.seed, m.init_std, m.n_layers)  # also recomputes Llama's rotary frequencies
    if t.compile:
        for block in model.layers.values():
            block.compile()
    params = list(model.parameters())
    groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": t.weight_decay},
              {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
    kernel = {"fused": True} if fused else {"foreach": False}
    opt = torch.optim.AdamW(groups, lr=t.lr, betas=(t.beta1, t.beta2), eps=t.eps, **kernel)
    scaler = torch.amp.GradScaler(device.type, init_scale=cfg.precision.get("init_scale", 65536.0),
                                  enabled=dtype == torch.float16)
    stream = SampleStream(build_dataset(cfg.data, m, t.seed), t.seed)
    accum = t.global_batch_size // t.micro_batch_size

    def autocast():
        return torch.autocast(device.type, dtype=dtype) if dtype else contextlib.nullcontext()

    def sync():
        if cuda:
            torch.cuda.synchronize()

    model.train()
    step_times, losses = [], []
    for step in range(steps):
        if step == 1 and cuda:
            torch.cuda.reset_peak_memory_stats()  # as llmtrain: from the start of step 1 on
        sync()
        start = time.perf_counter()
        total = torch.zeros((), device=device)
        for micro in range(accum):
            x, y = stream.batch("train", step, micro, 0, 1, t.micro_batch_size, t.global_batch_size)
            x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
            with autocast():
                logits = model(x)
            loss = F.cross_entropy(logits.float().flatten(0, 1), y.flatten())
            scaler.scale(loss / accum).backward()
            total += loss.detach() / accum
        scaler.unscale_(opt)
        torch.nn.utils.clip_grad_norm_(params, t.grad_clip)
        for g in opt.param_groups:
            g["lr"] = lr_at(step, t)
        scaler.step(opt)
        scaler.update()
        opt.zero_grad(set_to_none=True)
        losses.append(float(total))  # llmtrain reads its loss every step too
        sync()
        step_times.append(time.perf_counter() - start)
    peak = torch.cuda.max_memory_allocated() / 2**30 if cuda else None
    return {"step_times": step_times, "losses": losses, "peak_gib": peak, "device": device.type}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=15)
    p.add_argument("--skip", type=int, default=5, help="warm-up steps left out of the median")
    p.add_argument("--no-fused", action="store_true", help="the plain per-parameter AdamW instead of the fused one")
    p.add_argument("--out", default=None, help="also write the JSON result here")
    p.add_argument("overrides", nargs="*")
    a = p.parse_args()
    if not 0 <= a.skip < a.steps:
        p.error("need 0 <= --skip < --steps")

    from llmtrain.config import compose_config
    from llmtrain.launch.config_probes import validate_here

    cfg = compose_config(a.overrides)
    validate_here(cfg)
    result = train(cfg, a.steps, fused=not a.no_fused)
    tokens = cfg.train.global_batch_size * cfg.model.seq_len
    median = statistics.median(result["step_times"][a.skip:])
    result.update(tokens_per_s=tokens / median, step_time_s=median, skip=a.skip)
    line = json.dumps(result)
    print(line)
    if a.out:
        with open(a.out, "w") as f:
            f.write(line + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
