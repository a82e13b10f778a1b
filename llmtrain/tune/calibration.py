"""The measured trials as points of the plan's calibration (plan/calibration.py holds the file and the fit): the
plan's step time split into compute at the device's peak and exposed communication, uncalibrated, and the step
time measured (tokens per step / the trial's median tokens/s)."""

from __future__ import annotations

import datetime

from llmtrain.plan import calibration
from llmtrain.plan.cli import plan_for


def uncalibrated_parts(cfg):
    """The plan of `cfg` with the profile's assumptions; its compute_s scaled back to 100% efficiency."""
    plan = plan_for(cfg, calibrated=False)
    plan.compute_s *= plan.hardware["efficiency"]
    return plan


def point(cfg, trial) -> dict:
    m, c = cfg.model, cfg.cluster
    tokens = cfg.train.global_batch_size * m.seq_len
    model = f"{m.name}-l{m.n_layers}-d{m.d_model}-s{m.seq_len}"  # overridden sizes are another model
    return {"key": f"{model}/{c.nnodes}x{c.nproc_per_node}/gb{cfg.train.global_batch_size}/{trial.layout}",
            "model": cfg.model.name, "layout": trial.layout, "compute_s": trial.compute_s, "comm_s": trial.comm_s,
            "measured_step_s": tokens / trial.tokens_per_s, "date": datetime.date.today().isoformat()}


def learn(cfg, profile: str, trials) -> calibration.Calibration | None:
    """Record the measured layout trials for this profile and model family; the calibration now in force.
    Refinement trials are left out: the plan's step time assumes the configured compile and fused optimizer, and
    a compiled trial's speed-up would read as a higher efficiency for every layout."""
    points = [point(cfg, t) for t in trials if t.measured and not t.refines]
    if not points:
        return calibration.lookup(profile, calibration.family(cfg.model))
    return calibration.record(profile, calibration.family(cfg.model), points)
