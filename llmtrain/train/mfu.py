"""What MFU is measured against: the model's training FLOPs per token and the device's dense peak, when one is
known (a GPU profile's, or one given with hardware.peak_tflops.<dtype>); a CPU's is not known unless given."""

from __future__ import annotations


def model_flops(cfg, device_type: str | None = None, log=None) -> tuple[float, float | None]:
    """(training FLOPs per token of this model, the device's dense peak FLOPS at the compute dtype, or None when
    no peak is known: MFU is then not shown, and `log` says so once, with how to give the peak).
    ConfigError when the GPU lacks the compute dtype (bf16 on a V100 or T4)."""
    from llmtrain.hardware.profiles import load_profile, missing_peak, resolve
    from llmtrain.plan.estimate import flops_per_token, stage_params

    _, _, non_embedding = stage_params(cfg)
    dtype = cfg.precision.compute_dtype
    hw = resolve(cfg.hardware, dtype, load_profile, device_type)
    if hw["peak_tflops"] is None:
        if log is not None:
            log(f"llmtrain: MFU not shown: {missing_peak(hw, dtype)}", flush=True)
        return flops_per_token(cfg, non_embedding), None
    return flops_per_token(cfg, non_embedding), hw["peak_tflops"] * 1e12
