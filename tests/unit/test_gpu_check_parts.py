"""Every part of scripts/gpu_check.sh in-process, with stand-in launches: each launch's overrides are composed into
a config as `llmtrain launch` would (a wrong key fails here), and its run directory gets the files the part reads
(metrics.jsonl, config.yaml, logs/rank0.status). The scripts a part runs (plain loop, async save bench, `llmtrain
tune`, `llmtrain compare`) are stood in for too. tests/integration/test_gpu_check.py keeps the real launches."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "scripts"))

import gpu_check_parts as g  # noqa: E402


def falling(n: int, start: float = 5.0) -> list[float]:
    return [start - 0.1 * i for i in range(n)]


class StandIn:
    """Part.launch and Part.run for one part: `loss(name, step)` gives each run's losses, `tokens_per_s(name)` its
    speed; on the GPU sizes the rows carry an MFU against a 989 TFLOPS peak."""

    def __init__(self, p: g.Part, loss=lambda name, step: 5.0 - 0.1 * step, tokens_per_s=lambda name: 1000.0,
                 peak=lambda name, cfg: 2**30):
        self.p, self.loss, self.tokens_per_s, self.peak = p, loss, tokens_per_s, peak
        self.launched: list[tuple[str, list[str]]] = []
        self.commands: list[list[str]] = []

    def launch(self, name: str, overrides: list[str], fresh: bool = True) -> Path:
        from omegaconf import OmegaConf

        from llmtrain.config import compose_config

        cfg = compose_config([*self.p.sizes.common(), *overrides])  # the part's plumbing: every key must exist
        self.launched.append((name, overrides))
        run = self.p.runs / name
        (run / "logs").mkdir(parents=True, exist_ok=True)
        (run / "config.yaml").write_text(OmegaConf.to_yaml(cfg))
        first = 1 if fresh or cfg.checkpoint.resume != "auto" else 4  # a resume goes on after step 3
        last = cfg.train.stop_at_step or cfg.train.max_steps
        gpu = self.p.sizes.device == "cuda"
        with (run / "metrics.jsonl").open("w" if fresh else "a") as f:
            for step in range(first, last + 1):
                row = {"step": step, "loss": self.loss(name, step), "tokens_per_s": self.tokens_per_s(name),
                       "step_time_s": 0.5, **({"mfu": 0.462, "peak_tflops": 989.0} if gpu else {})}
                if cfg.precision.name == "fp16":
                    row.update(loss_scale=65536.0, skipped_steps=0)
                f.write(json.dumps(row) + "\n")
        (run / "logs" / "rank0.status").write_text(json.dumps({"state_bytes": {"peak": self.peak(name, cfg)}}))
        return run

    def run(self, argv: list[str], capture: bool = False, env: dict | None = None) -> subprocess.CompletedProcess:
        self.commands.append(argv)
        out, stdout = lambda flag: Path(argv[argv.index(flag) + 1]), ""
        if "plain_loop.py" in argv[1]:
            steps = int(argv[argv.index("--steps") + 1])
            out("--out").write_text(json.dumps({"tokens_per_s": 1000.0,
                                                "losses": [self.loss("plain", s) for s in range(1, steps + 1)]}))
        elif "bench_async_save.py" in argv[1]:
            out("--json").write_text(json.dumps({"sync_s": 5.0, "blocked_s": 0.25, "blocked_fraction": 0.05,
                                                 "step_during_write_s": 2.0, "step_s": 1.5}))
        elif argv[3] == "tune":
            winner = "dp1-tp1-pp1-zero0-mb2-rc-none"
            self.launch(f"tune/{winner}", [a for a in argv[5:] if "=" in a and not a.startswith("run.dir=")])
            stdout = (f"tune: the plan is now calibrated from 3 trials on cpu, x (efficiency 50.0%)\n"
                      f"tune: fastest measured: {winner} (1,000 tokens/s)\n")
        return subprocess.CompletedProcess(argv, 0, stdout, "")


@pytest.fixture
def part(tmp_path, monkeypatch):
    def make(device: str = "cpu", **kw):
        p = g.Part(tmp_path, g.Sizes(device))
        stand_in = StandIn(p, **kw)
        monkeypatch.setattr(p, "launch", stand_in.launch)
        monkeypatch.setattr(p, "run", stand_in.run)
        return p, stand_in
    return make


def test_smoke(part):
    p, s = part()
    assert g.part_smoke(p) == ("PASS", "6 steps, loss 4.900 -> 4.400")
    assert s.launched[0][0] == "smoke"


def test_throughput_runs_the_defaults_then_the_plans_layout_and_names_mfus_peak(part, monkeypatch):
    p, s = part("cuda", tokens_per_s=lambda name: 51000.0 if name == "big-fastest" else 44000.0)
    monkeypatch.setattr(g, "device_memory_gib", lambda device: 139.8)
    monkeypatch.setattr(g, "suggest_plans", lambda overrides, gib: [{"dims": {"recompute": "none", "zero": 0}}])
    assert g.part_throughput(p) == ("PASS", (
        "defaults (micro 4): 44,000 tok/s, MFU 46.2% of 989 TFLOPS bf16; fastest (micro 8, recompute=none "
        "parallel.zero=0 optim.fused=torch train.compile=true): 51,000 tok/s, MFU 46.2% of 989 TFLOPS bf16"))
    assert [name for name, _ in s.launched] == ["big-defaults", "big-fastest"]
    assert "train.micro_batch_size=8" in s.launched[1][1]
    # memory then reuses the defaults run: one more launch only, the recompute=full one
    monkeypatch.setattr(g, "planned_peak", lambda overrides: 2**30)
    status, figures = g.part_memory(p)
    assert status == "PASS" and figures.startswith("recompute=none: 1.00 GiB measured, plan 1.00 GiB (1.000x)")
    assert [name for name, _ in s.launched][2:] == ["big-recompute-full"]


def test_plain_compares_with_the_loop_on_the_same_losses(part):
    p, s = part()
    status, figures = g.part_plain(p)
    assert (status, figures) == ("PASS", "llmtrain 1,000 / plain 1,000 tok/s = 1.000x (micro 2; pass >= 0); losses "
                                         "of steps 1-10 within 0.0e+00 (pass <= 0.001)")
    assert "--no-fused" in s.commands[0] and "precision=fp32" in s.commands[0]


def test_fp16_memory_resume(part):
    p, _ = part()
    status, figures = g.part_fp16(p)
    assert status == "PASS" and figures.endswith("loss scale 65536.0, skipped steps 0")
    status, figures = g.part_memory(p)  # the CPU plan against a stand-in peak: far off, so FAIL, with both sizes
    assert status == "FAIL" and figures.startswith("recompute=none: 1.00 GiB measured, plan ")
    assert g.part_resume(p) == ("PASS", "saved at step 3, resumed to 6: losses of steps 1-6 bitwise equal to the "
                                        "uninterrupted run (pass <= 0.001)")


def test_resume_fails_when_the_resumed_losses_differ(part):
    p, _ = part(loss=lambda name, step: 5.0 - 0.1 * step + (0.01 if name == "resume-split" and step > 3 else 0))
    status, figures = g.part_resume(p)
    assert status == "FAIL" and "max relative difference 2.3e-03" in figures


def test_async_save_apex_fp8_on_cpu(part):
    p, s = part()
    assert g.part_async_save(p) == ("PASS", "sync save 5.00 s; async blocks 0.25 s = 5.0% of it (target <= 10%: met); "
                                            "steps during the background write 2.00 s vs 1.50 s")
    assert g.part_apex(p) == ("SKIP", "apex needs CUDA")
    status, figures = g.part_fp8(p)
    assert status == "SKIP" and "device=cpu" in figures and s.launched == []


def test_tune_reports_the_winner_against_the_defaults(part):
    p, _ = part()
    status, figures = g.part_tune(p)
    assert status == "PASS" and figures.startswith("winner dp1-tp1-pp1-zero0-mb2-rc-none: 1,000 tok/s, MFU not shown")
    assert figures.endswith("; calibrated from 3 trials on cpu, x (efficiency 50.0%)")


def test_llama_on_cpu_runs_bf16_only(part):
    p, s = part()
    status, figures = g.part_llama(p)
    assert status == "PASS" and figures.startswith("llama-tiny micro 2: bf16 1,000 tok/s, MFU not shown (no known "
                                                   "peak), loss 4.900 -> 4.000; fp8 not run: ")
    assert [name for name, _ in s.launched] == ["llama-bf16"]


def llama_on_gpu(part, monkeypatch, loss, speed):
    import llmtrain.launch.config_probes as probes

    monkeypatch.setattr(probes, "fp8_problem", lambda cfg: None)  # as on an H200 with torchao
    p, s = part("cuda", loss=loss, tokens_per_s=lambda name: speed[name])
    return g.part_llama(p), s


SPEED = {"llama-bf16": 58000.0, "llama-fp8-tensorwise": 64000.0, "llama-fp8-rowwise": 61000.0}


def test_llama_compares_each_fp8_recipe_and_names_the_fastest_within_1_percent(part, monkeypatch):
    (status, figures), s = llama_on_gpu(part, monkeypatch, lambda name, step: 10.0 - 0.2 * step, SPEED)
    assert status == "PASS", figures
    assert figures == (
        "llama3-1b micro 4, compiled: bf16 58,000 tok/s, MFU 46.2% of 989 TFLOPS bf16, loss 9.800 -> 4.000; fp8 "
        "tensorwise 64,000 tok/s (1.103x bf16), MFU 46.2% of 989 TFLOPS bf16, loss at step 30 0.00% from bf16's; fp8 "
        "rowwise 61,000 tok/s (1.052x bf16), MFU 46.2% of 989 TFLOPS bf16, loss at step 30 0.00% from bf16's; "
        "fastest within 1%: tensorwise (1.103x bf16) (pass: every recipe's loss at step 30 within 1% of bf16's, which "
        "fell by more than 1, the fastest >= 1x bf16)")
    assert [(name, o[-1]) for name, o in s.launched] == [
        ("llama-bf16", "train.compile=true"), ("llama-fp8-tensorwise", "precision.fp8_recipe=tensorwise"),
        ("llama-fp8-rowwise", "precision.fp8_recipe=rowwise")]
    assert all("train.max_steps=30" in o for _, o in s.launched)


def test_llama_skips_a_recipe_whose_loss_drifts(part, monkeypatch):
    def loss(name, step):  # tensorwise ends 2% above bf16: rowwise is the fastest that keeps the loss
        return (10.0 - 0.2 * step) * (1.02 if name == "llama-fp8-tensorwise" and step == 30 else 1.0)

    (status, figures), _ = llama_on_gpu(part, monkeypatch, loss, SPEED)
    assert status == "FAIL" and "loss at step 30 2.00% from bf16's" in figures
    assert "fastest within 1%: rowwise (1.052x bf16)" in figures


def test_llama_fails_when_bf16s_loss_does_not_fall(part, monkeypatch):
    (status, figures), _ = llama_on_gpu(part, monkeypatch, lambda name, step: 10.0 - 0.01 * step, SPEED)
    assert status == "FAIL" and "loss 9.990 -> 9.700" in figures and "fastest within 1%: tensorwise" in figures


def test_llama_keeps_the_finished_runs_when_stopped(part, monkeypatch, tmp_path):
    def launch_fails_for_rowwise(name, step):
        if name == "llama-fp8-rowwise":
            raise RuntimeError("stopped")
        return 10.0 - 0.2 * step

    with pytest.raises(RuntimeError, match="stopped"):
        llama_on_gpu(part, monkeypatch, launch_fails_for_rowwise, SPEED)
    row = json.loads((tmp_path / "results" / "llama.json").read_text())
    assert row["status"] == "FAIL" and row["detail"].endswith("; fp8 rowwise did not finish")
    assert "fp8 tensorwise 64,000 tok/s (1.103x bf16)" in row["detail"]


def test_fp8_part_on_gpu_compares_losses_and_speed(part, monkeypatch):
    import llmtrain.launch.config_probes as probes

    monkeypatch.setattr(probes, "fp8_problem", lambda cfg: None)
    p, s = part("cuda", loss=lambda name, step: 10.0 - 0.2 * step,
                tokens_per_s=lambda name: 55000.0 if name == "fp8-fp8" else 49000.0)
    status, figures = g.part_fp8(p)
    assert status == "PASS" and figures.startswith("gpt-1.3b micro 4, compiled: fp8 55,000 / bf16 49,000 tok/s = "
                                                   "1.122x (pass >= 1); loss at step 30: fp8 4.0000, bf16 4.0000")
    assert any(c[3] == "compare" for c in s.commands)


def test_mfu_text_names_the_peak_or_says_there_is_none():
    assert g.mfu_text({"mfu": 0.4621, "peak_tflops": 989.0, "dtype": "bf16"}) == "MFU 46.2% of 989 TFLOPS bf16"
    assert g.mfu_text({"mfu": None, "peak_tflops": None, "dtype": "fp32"}) == "MFU not shown (no known peak)"


def test_moe_runs_grouped_then_loop(part):
    from gpu_check_moe import part_moe

    p, s = part()
    status, figures = part_moe(p)
    assert status == "PASS" and figures.endswith("grouped / loop 1.000x; step-1 losses 0.0e+00 apart (pass <= 0.01); "
                                                 "losses fell over 10 steps")
    assert [(name, o[-1]) for name, o in s.launched] == [("moe-grouped-on", "model.moe.grouped_mm=on"),
                                                         ("moe-grouped-off", "model.moe.grouped_mm=off")]


def test_long_launches_the_plans_layout(part, monkeypatch):
    import gpu_check_long

    plan = {"dims": {"micro_batch_size": 1, "recompute": "full", "zero": 0}, "tokens_per_s": 900.0,
            "peak_bytes_per_rank": 2**30}
    monkeypatch.setattr(gpu_check_long, "suggest_plans", lambda overrides, gib: [plan])
    p, s = part()
    status, figures = gpu_check_long.part_long(p)
    assert status == "PASS", figures
    assert "train.micro_batch_size=1 recompute=full parallel.zero=0: 1,000 tok/s (plan 900)" in figures
    assert "peak 1.00 GiB measured, plan 1.00 GiB (1.000x; pass within 10%); 10 of 10 steps" in figures


def test_step_on_cpu_runs_full_chunked_and_math_attention(part):
    from gpu_check_step import part_step

    p, s = part(tokens_per_s=lambda name: 1100.0 if name == "step-loss-chunked" else 1000.0)
    status, figures = part_step(p)
    assert (status, figures) == ("PASS", (
        "llama-tiny seq 64 micro 2; loss=full 1,000 tok/s, MFU not shown (no known peak), peak 1.00 GiB; "
        "loss=chunked 1,100 tok/s, MFU not shown (no known peak), peak 1.00 GiB; loss=liger not run on CPU (liger "
        "runs on CUDA only); attention=math 1,000 tok/s, MFU not shown (no known peak), peak 1.00 GiB; cudnn and "
        "flash attention not run on CPU (attention=math instead); fastest: loss=chunked (1.100x loss=full) (pass: "
        "every run's 5 losses finite)"))
    assert [(name, o[-1]) for name, o in s.launched] == [
        ("step-loss-full", "train.loss=full"), ("step-loss-chunked", "train.loss=chunked"),
        ("step-attention-math", "train.loss=auto")]
    assert all("profile.memory=true" in o and "train.max_steps=5" in o for _, o in s.launched)
    assert "train.attention=math" in s.launched[2][1]


STEP_SPEED = {"step-loss-full": 50000.0, "step-loss-chunked": 55000.0, "step-loss-liger": 57000.0,
              "step-attention-cudnn": 60000.0, "step-attention-flash": 56000.0}


def step_on_gpu(part, monkeypatch, liger: bool, fails: tuple[str, ...] = (), loss=lambda name, step: 10.0 - step / 10):
    import llmtrain.loss
    from gpu_check_step import part_step

    monkeypatch.setattr(llmtrain.loss, "liger_installed", lambda: liger)
    p, s = part("cuda", loss=loss, tokens_per_s=lambda name: STEP_SPEED[name],
                peak=lambda name, cfg: 3 * 2**30 if cfg.train.loss == "full" else 2 * 2**30)
    stand_in_launch = p.launch

    def launch(name, overrides, fresh=True):
        if name in fails:  # as Part.launch raises for a launch that exits non-zero
            raise RuntimeError(f"llmtrain launch {name} failed (exit 1); see runs/{name}/logs")
        return stand_in_launch(name, overrides, fresh)

    monkeypatch.setattr(p, "launch", launch)
    return part_step(p), s


def test_step_on_gpu_names_each_variant_and_the_fastest_against_full_loss(part, monkeypatch):
    (status, figures), s = step_on_gpu(part, monkeypatch, liger=False)
    assert (status, figures) == ("PASS", (
        "llama3-1b seq 2048 micro 4, compiled; loss=full 50,000 tok/s, MFU 46.2% of 989 TFLOPS bf16, peak 3.00 GiB; "
        "loss=chunked 55,000 tok/s, MFU 46.2% of 989 TFLOPS bf16, peak 2.00 GiB; loss=liger not installed "
        "(liger_kernel is not importable); attention=cudnn 60,000 tok/s, MFU 46.2% of 989 TFLOPS bf16, peak 2.00 GiB; "
        "attention=flash 56,000 tok/s, MFU 46.2% of 989 TFLOPS bf16, peak 2.00 GiB; fastest: attention=cudnn (1.200x "
        "loss=full) (pass: every run's 12 losses finite)"))
    assert [name for name, _ in s.launched] == ["step-loss-full", "step-loss-chunked", "step-attention-cudnn",
                                                "step-attention-flash"]
    for _, o in s.launched:  # the llama part's model, batch and compile
        assert {"model=llama3-1b", "model.seq_len=2048", "precision=bf16", "train.micro_batch_size=4",
                "train.global_batch_size=8", "train.compile=true", "train.max_steps=12"} <= set(o)
    assert s.launched[2][1][-2:] == ["train.attention=cudnn", "train.loss=auto"]


def test_step_runs_liger_where_it_is_installed(part, monkeypatch):
    (status, figures), s = step_on_gpu(part, monkeypatch, liger=True)
    assert status == "PASS" and "loss=liger 57,000 tok/s, MFU 46.2% of 989 TFLOPS bf16, peak 2.00 GiB" in figures
    assert ("step-loss-liger", ["train.loss=liger"]) == (s.launched[2][0], s.launched[2][1][-1:])


def test_step_reports_a_refused_attention_kernel_and_fails_on_a_failed_loss(part, monkeypatch):
    (status, figures), _ = step_on_gpu(part, monkeypatch, liger=False, fails=("step-attention-cudnn",))
    assert status == "PASS" and ("attention=cudnn failed (llmtrain launch step-attention-cudnn failed (exit 1); see "
                                 "runs/step-attention-cudnn/logs)") in figures
    assert "fastest: attention=flash (1.120x loss=full)" in figures
    (status, figures), _ = step_on_gpu(part, monkeypatch, liger=False, fails=("step-loss-chunked",))
    assert status == "FAIL" and "loss=chunked failed (" in figures
    (status, figures), _ = step_on_gpu(part, monkeypatch, liger=False, fails=("step-loss-full",))
    assert status == "FAIL" and figures.endswith("no fastest: loss=full did not run (pass: every run's 12 losses "
                                                 "finite)")


def test_step_fails_on_a_non_finite_loss_and_keeps_the_finished_runs_when_stopped(part, monkeypatch, tmp_path):
    def loss(name, step):
        return float("nan") if name == "step-attention-flash" and step == 7 else 10.0 - step / 10

    (status, figures), _ = step_on_gpu(part, monkeypatch, liger=False, loss=loss)
    assert status == "FAIL" and "attention=flash losses not finite or missing (12 of 12 steps logged)" in figures
    assert "fastest: attention=cudnn" in figures
    with pytest.raises(KeyError):  # stopped in the cudnn run: the row so far stays
        step_on_gpu(part, monkeypatch, liger=False, loss=lambda name, step: {}["stop"] if "cudnn" in name else 9.0)
    row = json.loads((tmp_path / "results" / "step.json").read_text())
    assert row["status"] == "FAIL" and row["detail"].endswith("; attention=cudnn did not finish")
    assert "loss=chunked 55,000 tok/s" in row["detail"]
