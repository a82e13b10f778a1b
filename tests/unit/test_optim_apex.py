"""optim.fused: `auto` per device, torch's fused AdamW on CPU, apex's FusedAdam + FusedLayerNorm through a stand-in
apex package (the real kernels need CUDA), and one-line refusals: a missing apex, a layout apex cannot take, and
the retired apex amp precisions."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest
from helpers.apex_stand_in import ONE_PROCESS, stand_in_apex  # noqa: F401

from llmtrain.config import ConfigError, compose_config
from llmtrain.launch.config_probes import validate_here
from llmtrain.train.optim import resolve_fused


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

