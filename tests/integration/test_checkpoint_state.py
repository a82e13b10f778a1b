"""The state a checkpoint holds, in one process: the names the model and optimizer state are saved under (a
checkpoint written by hand in that layout loads into two pipeline stages held by one rank), and an untied head
saved under its own name."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.slow


@pytest.fixture
def one_rank(tmp_path):
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'pg'}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def _gpt_and_adamw(stages: list[int]):
    """A 4-layer GPT as the pipeline stages `stages` of a 2-stage split held by one rank (both ends: the last
    stage's head is a copy of the embedding), or whole for [], with AdamW over all of it."""
    import torch
    from omegaconf import OmegaConf

    from llmtrain.model import GPT, GPTArgs, init_parameters
    from llmtrain.parallel.pipeline import make_stage_module
    from llmtrain.train.optim import build_optimizer

    with torch.device("meta"):
        whole = GPT(GPTArgs(n_layers=4, n_heads=2, d_model=16, vocab_size=32, seq_len=8))
    parts = [make_stage_module(whole, s, [2, 2]) for s in stages] or [whole]
    for part in parts:
        part.to_empty(device="cpu")
        part.tie_weights()
        init_parameters(part, seed=0, std=0.02, n_layers=4)
    train = OmegaConf.create({"lr": 1e-2, "beta1": 0.9, "beta2": 0.95, "eps": 1e-8, "weight_decay": 0.1})
    return parts, build_optimizer(parts, train)


def _train_step(parts, optimizer, seed: int) -> float:
    """One AdamW step on a fixed batch; a pipeline's head copy takes the embedding's gradient summed with its own,
    as the trainer does."""
    import torch
    import torch.nn.functional as F

    ids = torch.randint(0, 32, (2, 9), generator=torch.Generator().manual_seed(seed))
    h = ids[:, :-1]
    for part in parts:
        h = part(h)
    loss = F.cross_entropy(h.flatten(0, 1), ids[:, 1:].flatten())
    loss.backward()
    params = {n: p for part in parts for n, p in part.named_parameters()}
    if len(parts) > 1:
        total = params["embed.tok.weight"].grad + params["head.weight"].grad
        params["embed.tok.weight"].grad, params["head.weight"].grad = total, total.clone()
    optimizer.step()
    optimizer.zero_grad()
    return loss.item()


def test_state_is_saved_by_parameter_name_and_loads_into_two_stages_on_one_rank(tmp_path, one_rank):
    """The saved names are the parameter names (what checkpoints of every layout and of earlier versions hold):
    a checkpoint written by hand in that layout loads into two pipeline stages held by one rank, whose next
    step then matches the whole model's; the head copy gets the embedding's value and moments, not shared ones."""
    import torch
    import torch.distributed.checkpoint as dcp

    from llmtrain.checkpoint.state import ModelState, OptimizerState

    parts, optimizer = _gpt_and_adamw([])
    fresh = OptimizerState(parts, optimizer)
    assert fresh.state_dict() == {} and not optimizer.state  # nothing to save yet, and no step taken to save it
    for seed in range(3):
        _train_step(parts, optimizer, seed)
    model = parts[0]
    by_hand = {"model": dict(model.named_parameters()),
               "optim": {f"{n}.{field}": value for n, p in model.named_parameters()
                         for field, value in optimizer.state[p].items()}}
    dcp.save(by_hand, checkpoint_id=tmp_path / "by_hand")
    dcp.save({"model": ModelState(parts), "optim": OptimizerState(parts, optimizer)}, checkpoint_id=tmp_path / "one")
    keys = set(dcp.FileSystemReader(tmp_path / "one").read_metadata().state_dict_metadata)
    assert keys == set(dcp.FileSystemReader(tmp_path / "by_hand").read_metadata().state_dict_metadata)
    assert {"model.embed.tok.weight", "optim.embed.tok.weight.exp_avg", "optim.layers.3.mlp.fc.weight.step"} < keys
    assert not any(k.startswith(("model.head", "optim.head")) for k in keys)  # the tied head: saved once

    stages, stage_optimizer = _gpt_and_adamw([0, 1])
    dcp.load({"model": ModelState(stages), "optim": OptimizerState(stages, stage_optimizer, for_load=True)},
             checkpoint_id=tmp_path / "by_hand")
    params = {n: p for part in stages for n, p in part.named_parameters()}
    embed, head = params["embed.tok.weight"], params["head.weight"]
    assert torch.equal(head, embed) and torch.equal(embed, model.embed.tok.weight)
    head_state, embed_state = stage_optimizer.state[head], stage_optimizer.state[embed]
    assert torch.equal(head_state["exp_avg"], embed_state["exp_avg"])
    assert head_state["exp_avg"].data_ptr() != embed_state["exp_avg"].data_ptr()
    assert {float(s["step"]) for s in stage_optimizer.state.values()} == {3.0}
    assert [g["lr"] for g in stage_optimizer.param_groups] == [1e-2, 1e-2]
    before = model.layers["3"].mlp.fc.weight.detach().clone()
    assert _train_step(stages, stage_optimizer, 3) == pytest.approx(_train_step(parts, optimizer, 3), abs=1e-6)
    for name, p in model.named_parameters():
        assert (params[name] - p).abs().max().item() <= 1e-6, name
    assert (model.layers["3"].mlp.fc.weight - before).abs().max().item() > 1e-4  # the step moved the weights
    # Saved from the two stages: the same names as from the whole model.
    dcp.save({"model": ModelState(stages), "optim": OptimizerState(stages, stage_optimizer)},
             checkpoint_id=tmp_path / "two")
    assert set(dcp.FileSystemReader(tmp_path / "two").read_metadata().state_dict_metadata) == keys


def test_an_untied_head_is_saved_under_its_own_name():
    """A tied head is saved once, as the embedding; an untied one (model.tie_embeddings=false) is a parameter of
    its own in the checkpoint, and loading puts it back. In-process, no process group."""
    import torch

    from llmtrain.checkpoint.state import ModelState
    from llmtrain.config import compose_config
    from llmtrain.model import build_model

    for tie in (True, False):
        cfg = compose_config(["model=llama-tiny", f"model.tie_embeddings={str(tie).lower()}"])
        torch.manual_seed(0)
        model = build_model(cfg.model)
        saved = ModelState([model]).state_dict()
        assert ("head.weight" in saved) is (not tie)
    assert torch.equal(saved["head.weight"], model.head.weight)
    assert not torch.equal(saved["head.weight"], saved["embed.tok.weight"])
    other = build_model(cfg.model)
    ModelState([other]).load_state_dict({name: value.clone() for name, value in saved.items()})
    assert torch.equal(other.head.weight, model.head.weight)
    assert torch.equal(other.embed.tok.weight, model.embed.tok.weight)
