"""gpu_check.sh's Llama part: llama3-1b in bf16 (tokens/s, MFU), then fp8 against it, both compiled.

Kept apart from gpu_check_parts.py, which calls `part_llama` lazily (the two modules share its Part and steady)."""

from __future__ import annotations

from gpu_check_parts import MIN_FP8_SPEEDUP, Part, mfu_text, steady

LLAMA_STEPS = 15


def part_llama(p: Part) -> tuple[str, str]:
    from llmtrain.config import compose_config
    from llmtrain.launch.config_probes import fp8_problem

    s = p.sizes
    gpu = s.device == "cuda"
    # llama3-1b at a 2048-token context (its 8192 default needs more memory than one GPU's micro-batch of 4 leaves
    # for a quick check); on CPU a llama-tiny of two layers in fp32.
    model = (["model=llama3-1b", "model.seq_len=2048", "precision=bf16"] if gpu else
             ["model=llama-tiny", "model.n_layers=2", "model.seq_len=64", "precision=fp32"])
    base = [*model, *s.batch(s.micro), f"train.max_steps={LLAMA_STEPS}", "train.warmup_steps=5",
            *(["optim.fused=torch", "train.compile=true"] if gpu else [])]
    bf16 = steady(p.launch("llama-bf16", base), s.skip)
    detail = (f"{model[0].split('=')[1]} micro {s.micro}{', compiled' if gpu else ''}: "
              f"{bf16['tokens_per_s']:,.0f} tok/s, {mfu_text(bf16['mfu'])}")
    fp8_base = [o for o in base if not o.startswith("precision=")] + ["precision=fp8"]
    problem = fp8_problem(compose_config([*fp8_base, *s.common()]))
    if problem:  # the CPU dry mode, a GPU below compute capability 8.9, no torchao
        return "PASS", f"{detail}; fp8 not run: {problem}"
    fp8 = steady(p.launch("llama-fp8", fp8_base), s.skip)
    ratio = fp8["tokens_per_s"] / bf16["tokens_per_s"]
    return ("PASS" if ratio >= MIN_FP8_SPEEDUP else "FAIL"), (
        f"{detail}; fp8 {fp8['tokens_per_s']:,.0f} tok/s, {mfu_text(fp8['mfu'])}, {ratio:.3f}x bf16 "
        f"(pass >= {MIN_FP8_SPEEDUP:g})")
