"""optim.fused: `auto` per device, torch's fused AdamW on CPU, apex's FusedAdam + FusedLayerNorm through a stand-in
apex package (the real kernels need CUDA), and one-line refusals: a missing apex, a layout apex cannot take, and
the retired apex amp precisions."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest
from conftest import SMALL, run_cli

from llmtrain.config import ConfigError, compose_config
from llmtrain.launch.config_probes import validate_here
from llmtrain.train.optim import resolve_fused

ONE_PROCESS = [*SMALL, "data=synthetic", "hardware=cpu", "cluster.nproc_per_node=1", "train.global_batch_size=4",
               "train.micro_batch_size=4", "train.max_steps=4", "checkpoint.at_end=false"]

# What llmtrain uses of current apex, with the interface quirks of the real classes: FusedAdam keeps one step count
# per param group (none per parameter) and its zero_grad() takes no set_to_none. amp_C and fused_layer_norm_cuda
# stand for the CUDA extensions, which validation looks for.
STAND_IN = {
    "apex/__init__.py": "from . import normalization, optimizers  # noqa: F401\n",
    "apex/normalization/__init__.py": '''
from torch import nn


class FusedLayerNorm(nn.LayerNorm):
    def __init__(self, normalized_shape, eps=1e-5, elementwise_affine=True, memory_efficient=False):
        super().__init__(normalized_shape, eps=eps, elementwise_affine=elementwise_affine)
        print("apex stand-in: FusedLayerNorm", flush=True)
''',
    "apex/optimizers/__init__.py": '''
import math

import torch


class FusedAdam(torch.optim.AdamW):
    def __init__(self, params, lr=1e-3, bias_correction=True, betas=(0.9, 0.999), eps=1e-8, adam_w_mode=True,
                 weight_decay=0.0, amsgrad=False, set_grad_none=True, capturable=False, master_weights=False):
        super().__init__(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, foreach=False)
        print("apex stand-in: FusedAdam", flush=True)

    def zero_grad(self):
        for group in self.param_groups:
            for p in group["params"]:
                p.grad = None

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            group["step"] = group["step"] + 1 if "step" in group else 1
            beta1, beta2 = group["betas"]
            t, lr = group["step"], group["lr"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if len(state) == 0:
                    state["exp_avg"] = torch.zeros_like(p)
                    state["exp_avg_sq"] = torch.zeros_like(p)
                m, v = state["exp_avg"], state["exp_avg_sq"]
                p.mul_(1 - lr * group["weight_decay"])
                m.lerp_(p.grad, 1 - beta1)
                v.mul_(beta2).addcmul_(p.grad, p.grad, value=1 - beta2)
                denom = (v.sqrt() / math.sqrt(1 - beta2 ** t)).add_(group["eps"])
                p.addcdiv_(m, denom, value=-lr / (1 - beta1 ** t))
''',
    "amp_C.py": "",
    "fused_layer_norm_cuda.py": "",
}


@pytest.fixture
def stand_in_apex(tmp_path, monkeypatch):
    """Call with extensions=False for a Python-only apex. Importable in this process and, through PYTHONPATH, in
    the processes it starts; forgotten again afterwards (find_spec would otherwise find the cached modules)."""
    import importlib
    import sys

    def install(extensions: bool = True) -> Path:
        root = tmp_path / "site"
        for name, text in STAND_IN.items():
            if extensions or not name.endswith(("_C.py", "_cuda.py")):
                (root / name).parent.mkdir(parents=True, exist_ok=True)
                (root / name).write_text(text)
        monkeypatch.syspath_prepend(str(root))
        importlib.invalidate_caches()
        return root

    yield install
    for name in [m for m in sys.modules if m.split(".")[0] in ("apex", "amp_C", "fused_layer_norm_cuda")]:
        del sys.modules[name]


def config_error(*overrides: str) -> str:
    with pytest.raises(ConfigError) as e:
        validate_here(compose_config(list(overrides)))
    return str(e.value)


# ---- resolution -------------------------------------------------------------------------------------------------

def test_auto_is_torch_fused_on_cuda_and_the_plain_loop_on_cpu():
    assert resolve_fused("auto", "cuda") == "torch"
    assert resolve_fused("auto", "cpu") == "none"
    for explicit in ("none", "torch", "apex"):
        assert resolve_fused(explicit, "cuda") == explicit and resolve_fused(explicit, "cpu") == explicit


def test_step_counters_move_to_their_parameters_device_before_the_first_step():
    """A checkpoint restores AdamW's step counters on the CPU; torch's fused CUDA kernel wants them next to the
    parameters. "meta" stands in for the GPU here: SGD runs on it and leaves a step counter alone."""
    import torch

    from llmtrain.train.optim import steps_follow_params

    param = torch.nn.Parameter(torch.zeros(2, device="meta"))
    optimizer = torch.optim.SGD([param], lr=0.1)
    optimizer.state[param]["step"] = torch.tensor(3.0)
    steps_follow_params(optimizer)
    param.grad = torch.zeros(2, device="meta")
    optimizer.step()
    assert optimizer.state[param]["step"].device.type == "meta"
    optimizer.state[param]["step"] = torch.tensor(4.0)
    optimizer.step()  # once only: later steps pay nothing
    assert optimizer.state[param]["step"].device.type == "cpu"


def test_auto_is_the_default():
    assert compose_config([]).optim.fused == "auto"


def test_unknown_fused_value_names_the_choices():
    assert config_error("optim.fused=fast") == \
        "optim.fused: must be one of auto, none, torch, apex (got fast)"


# ---- refusals -----------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("command", [["launch", "precision=apex-o1"], ["plan", "precision=apex-o2"]],
                         ids=["launch-o1", "plan-o2"])
def test_retired_apex_amp_precisions_are_one_line(command, tmp_path):
    name = command[1].split("=")[1]
    result = run_cli([command[0], *command[1:], f"run.dir={tmp_path / 'r'}"])
    assert result.returncode == 2
    assert result.stderr == (
        f"llmtrain: error: precision: {name} is retired: current NVIDIA apex has no amp (apex.amp was removed); "
        "precision=fp16 is the O1 recipe (autocast + dynamic loss scaling starting at 2^16) and precision=bf16 "
        "the modern default (no loss scaling needed)\n")
    assert result.stdout == "" and not (tmp_path / "r").exists()


def test_fused_apex_without_apex_says_how_to_build_it(tmp_path):
    try:
        import apex  # noqa: F401
        pytest.skip("apex is installed here")
    except ImportError:
        pass
    result = run_cli(["launch", f"run.dir={tmp_path / 'r'}", "optim.fused=apex", "cluster.nproc_per_node=1"])
    assert result.returncode == 2
    assert result.stderr == (
        "llmtrain: error: optim.fused: NVIDIA apex is not installed (it is not on PyPI); optim.fused=apex needs its "
        "CUDA extensions amp_C and fused_layer_norm_cuda: git clone https://github.com/NVIDIA/apex && cd apex && "
        "APEX_CUDA_EXT=1 pip install -v --no-build-isolation . (docs/parallelism.md, 'Fused AdamW and NVIDIA apex': a build of "
        "just these two); or use optim.fused=auto (torch's fused AdamW on CUDA, no build)\n")
    assert not (tmp_path / "r").exists()


def test_apex_without_its_cuda_extensions_is_named(stand_in_apex):
    stand_in_apex(extensions=False)
    assert config_error("optim.fused=apex", "cluster.nproc_per_node=1").startswith(
        "optim.fused: NVIDIA apex is installed without its CUDA extension(s) amp_C and fused_layer_norm_cuda "
        "(a Python-only build); rebuild it: git clone https://github.com/NVIDIA/apex")


@pytest.mark.parametrize("layout,named", [([], "parallel.dp=2"), (["parallel.tp=2"], "parallel.tp=2"),
                                          (["cluster.nproc_per_node=4", "parallel.tp=2"],
                                           "parallel.dp=2 and parallel.tp=2")])
def test_apex_refuses_layouts_with_dtensor_parameters_before_asking_for_apex(layout, named):
    # Refused whether apex is there or not: nobody should build apex for a layout that cannot use it.
    assert config_error("optim.fused=apex", *layout) == (
        f"optim.fused: apex's FusedAdam and FusedLayerNorm take plain tensors, and {named} hold the parameters as "
        "DTensors (FSDP2, tensor parallel); use optim.fused=auto or torch (every layout), or apex with "
        "parallel.dp=1 parallel.tp=1 (pipeline stages are fine)")


def test_apex_with_pipeline_stages_passes_validation(stand_in_apex):
    stand_in_apex()
    validate_here(compose_config(["optim.fused=apex", "parallel.pp=2"]))


# ---- training in this process (one rank) -------------------------------------------------------------------------

@pytest.fixture
def one_rank(tmp_path):
    import torch.distributed as dist

    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGUSR1)}
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'pg'}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()
    for sig, handler in handlers.items():  # the trainer's preemption handlers
        signal.signal(sig, handler)


def train(run_dir: Path, *overrides: str):
    """A Trainer of ONE_PROCESS + overrides in this process; returns it after training, with its loss per step."""
    import torch

    from llmtrain.train.trainer import Trainer

    cfg = compose_config([*ONE_PROCESS, f"run.dir={run_dir}", *overrides])
    validate_here(cfg)
    run_dir.mkdir()
    torch.manual_seed(cfg.train.seed)
    trainer = Trainer(cfg, str(run_dir), torch.device("cpu"))
    trainer.train()
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return trainer, {r["step"]: r["loss"] for r in rows if "loss" in r}


def test_fused_torch_trains_on_cpu_like_the_plain_loop(tmp_path, one_rank, capsys):
    import torch

    plain, plain_losses = train(tmp_path / "auto")  # the default: auto, the plain loop on CPU
    assert "; optim.fused=auto -> none on cpu; 4 steps of 4 x 64 tokens" in capsys.readouterr().out
    fused, fused_losses = train(tmp_path / "torch", "optim.fused=torch")
    assert "; optim.fused=torch; 4 steps of 4 x 64 tokens" in capsys.readouterr().out
    assert all(g["fused"] for g in fused.optimizer.param_groups)
    assert not any(g["fused"] for g in plain.optimizer.param_groups) and plain.fused == "none"
    assert isinstance(fused.optimizer, torch.optim.AdamW) and fused.fused == "torch"
    assert sorted(fused_losses) == [1, 2, 3, 4] and fused_losses[4] < fused_losses[1]
    assert max(abs(fused_losses[s] - plain_losses[s]) for s in plain_losses) <= 1e-6


def test_fused_apex_trains_with_fused_adam_and_fused_layer_norm(tmp_path, one_rank, stand_in_apex, capsys):
    from torch import nn

    stand_in_apex()
    from apex.normalization import FusedLayerNorm
    from apex.optimizers import FusedAdam

    _, plain_losses = train(tmp_path / "none", "optim.fused=none")
    trainer, losses = train(tmp_path / "apex", "optim.fused=apex")
    model = trainer.model.parts[0]
    norms = [m for m in model.modules() if isinstance(m, nn.LayerNorm)]
    assert len(norms) == 2 * 4 + 1 and all(type(m) is FusedLayerNorm for m in norms)
    assert isinstance(trainer.optimizer, FusedAdam)
    assert [g["step"] for g in trainer.optimizer.param_groups] == [4, 4]
    # The step count is also in every parameter's state, where checkpoints read it.
    assert {float(s["step"]) for s in trainer.optimizer.state.values()} == {4.0}
    assert sorted(losses) == [1, 2, 3, 4]
    assert max(abs(losses[s] - plain_losses[s]) for s in plain_losses) <= 1e-6
    assert "; optim.fused=apex; 4 steps of 4 x 64 tokens" in capsys.readouterr().out


# ---- through the launcher -----------------------------------------------------------------------------------------

@pytest.mark.slow
def test_fused_apex_run_resumes_exactly_with_apex_or_torch(tmp_path, stand_in_apex):
    """apex's step count survives a checkpoint (it lives per param group, and is saved per parameter), so a
    stopped apex run resumes with the uninterrupted run's losses, with apex or with torch's AdamW."""
    import shutil

    from conftest import launch, train_losses

    env = {"PYTHONPATH": str(stand_in_apex())}
    args = [*ONE_PROCESS, "train.max_steps=6"]

    def run(run_dir: Path, *overrides: str):
        result = run_cli(["launch", f"run.dir={run_dir}", *args, *overrides], env=env)
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
        return result

    launch(tmp_path / "plain", *args, "optim.fused=none")
    reference = train_losses(tmp_path / "plain")
    run(tmp_path / "apex", "optim.fused=apex", "train.stop_at_step=3")
    log = (tmp_path / "apex" / "logs" / "rank0.log").read_text()
    assert log.count("apex stand-in: FusedLayerNorm") == 2 * 4 + 1 and log.count("apex stand-in: FusedAdam") == 1
    shutil.copytree(tmp_path / "apex", tmp_path / "apex-then-torch")
    for run_dir, fused in ((tmp_path / "apex", "apex"), (tmp_path / "apex-then-torch", "torch")):
        assert "resuming from" in run(run_dir, f"optim.fused={fused}").stdout
        losses = train_losses(run_dir)
        assert sorted(losses) == [1, 2, 3, 4, 5, 6]
        assert max(abs(losses[s] - reference[s]) for s in reference) <= 1e-6, (fused, losses, reference)
