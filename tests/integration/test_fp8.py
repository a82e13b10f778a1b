"""precision=fp8 (torchao float8): the rules that refuse it before launch, which layers become float8, parameter names
and checkpoints across fp8 and bf16, `llmtrain plan`'s figures, and training steps against bf16.

torchao's float8 layers run on CPU (torch._scaled_mm has a CPU kernel), which is what these tests use. llmtrain
itself refuses fp8 on a CPU, so the runs through the trainer simulate a Hopper GPU the way tests/test_hardware.py
does: hardware=auto sees an H100 (compute capability 9.0) while the run uses this CPU.
"""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F
from helpers.fp8_cases import H100, NEEDS, PARITY, TINY
from torch import nn

from llmtrain.cli import main
from llmtrain.config import ConfigError, compose_config
from llmtrain.hardware import profiles as hardware
from llmtrain.launch.config_probes import validate_here
from llmtrain.model import GPT, GPTArgs, init_parameters


MULTIPLES = "precision: fp8's float8 matmuls take only dimensions that are multiples of 16, and "
SHAPE_FIX = "; change the model shape (or parallel.tp) or use precision=bf16"
BLOCK_LINEARS = ("attn.q", "attn.k", "attn.v", "attn.proj", "mlp.fc", "mlp.proj")


def simulate_gpu(monkeypatch, name: str = H100, capability: str = "9.0") -> None:
    """hardware=auto (validation on cluster=local, and the worker) sees this GPU; the run still uses the CPU."""
    monkeypatch.setattr(hardware, "device_name", lambda device_type=None: name)
    monkeypatch.setattr(hardware, "device_capability", lambda: capability)
    monkeypatch.setattr(hardware, "device_memory_gib", lambda: 80.0)


def config_error(capsys, *overrides: str) -> str:
    """`llmtrain config OVERRIDES`: exit 2 and exactly one line on stderr, which is returned."""
    code = main(["config", *overrides])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1, (code, err)
    return err.strip()


# ---- refused before launch -------------------------------------------------------------------------------------

REFUSED = [
    (["device=cpu"], NEEDS + "device=cpu trains on the CPU; use precision=bf16"),
    (["hardware=cpu"], NEEDS + "hardware=cpu is a CPU; use precision=bf16"),
    (["hardware=a100"], NEEDS + "hardware=a100 has compute capability 8.0; use precision=bf16"),
    # before the hardware rule that would answer "hardware=t4 has no bf16; use precision=fp16"
    (["hardware=t4"], NEEDS + "hardware=t4 has compute capability 7.5; use precision=bf16"),
    (["hardware=mi250x"], NEEDS + "hardware=mi250x has no float8 matmuls; use precision=bf16"),
    (["hardware=h100", "model.d_model=72", "model.n_heads=4"], MULTIPLES + "model.d_model is 72" + SHAPE_FIX),
    (["hardware=h100", "model.d_model=64", "model.n_heads=4", "model.head_dim=10"],
     MULTIPLES + "the attention width (n_heads x head_dim) is 40" + SHAPE_FIX),
    (["hardware=h100", "model.d_model=64", "model.n_heads=8", "parallel.tp=8", "cluster.nproc_per_node=8"],
     MULTIPLES + "the attention width per parallel.tp=8 rank is 8" + SHAPE_FIX),
    (["hardware=h100", "precision.fp8_recipe=blockwise"],
     "precision.fp8_recipe: must be one of tensorwise, rowwise, rowwise_with_gw_hp (got blockwise)"),
]


@pytest.mark.parametrize("overrides,line", REFUSED, ids=[" ".join(o) for o, _ in REFUSED])
def test_fp8_is_refused_before_launch_in_one_line(overrides, line, capsys):
    assert config_error(capsys, "precision=fp8", *overrides) == f"llmtrain: error: {line}"


def test_auto_on_a_node_without_cuda_is_the_cpu(monkeypatch, capsys):
    monkeypatch.setattr(hardware, "device_name", lambda device_type=None: None)
    assert config_error(capsys, "precision=fp8") == (
        f"llmtrain: error: {NEEDS}device=auto trains on the CPU here (this node has no CUDA device); "
        "use precision=bf16")


def test_auto_on_a_gpu_below_8_9_is_refused_and_on_hopper_accepted(monkeypatch, capsys):
    simulate_gpu(monkeypatch, "NVIDIA A100-SXM4-80GB", "8.0")
    assert config_error(capsys, "precision=fp8") == (
        f"llmtrain: error: {NEEDS}the detected GPU (NVIDIA A100-SXM4-80GB) has compute capability 8.0; "
        "use precision=bf16")
    simulate_gpu(monkeypatch)
    assert main(["config", "precision=fp8"]) == 0


def test_without_torchao_the_line_says_how_to_install_it(monkeypatch, capsys):
    import importlib.util

    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "torchao" else
                        find_spec(name, *a))
    assert config_error(capsys, "precision=fp8", "hardware=h100") == (
        "llmtrain: error: precision: fp8 needs torchao (its float8 training), which is not installed: "
        "pip install 'llmtrain[fp8]' (in a checkout: pip install -e '.[fp8]')")


@pytest.mark.parametrize("recipe", ["tensorwise", "rowwise", "rowwise_with_gw_hp"])
def test_a_float8_gpu_takes_every_recipe(recipe, capsys):
    pytest.importorskip("torchao")
    for gpu in ("h100", "l4", "b200", "mi300x"):
        assert main(["config", "precision=fp8", f"hardware={gpu}", f"precision.fp8_recipe={recipe}"]) == 0, \
            capsys.readouterr().err
    cfg = compose_config(["precision=fp8", "hardware=h100"])
    assert (cfg.precision.compute_dtype, cfg.precision.fp8_recipe) == ("bfloat16", "tensorwise")


# ---- the worker's own check (hardware=auto, known only on the node) -------------------------------------------



def trainer(run_dir, *overrides: str, check: bool = True):
    from llmtrain.train.trainer import Trainer

    cfg = compose_config([*TINY, f"run.dir={run_dir}", *overrides])
    if check:
        validate_here(cfg)
    return Trainer(cfg, str(run_dir), torch.device("cpu"))


def test_the_worker_refuses_a_gpu_below_8_9_with_the_same_line(monkeypatch, tmp_path, one_rank, capsys):
    simulate_gpu(monkeypatch, "NVIDIA A100-SXM4-80GB", "8.0")
    before_launch = config_error(capsys, "precision=fp8")
    with pytest.raises(ConfigError) as refused:  # what a worker of an ssh or slurm job, validated elsewhere, does
        trainer(tmp_path, "precision=fp8", check=False)
    assert f"llmtrain: error: {refused.value}" == before_launch


# ---- conversion ------------------------------------------------------------------------------------------------


def tiny_gpt(n_layers: int = 2) -> GPT:
    model = GPT(GPTArgs(n_layers=n_layers, n_heads=4, d_model=64, vocab_size=256, seq_len=64))
    init_parameters(model, 1234, 0.02, n_layers)
    return model


def float8(recipe: str = "tensorwise", all_gather: bool = False):
    pytest.importorskip("torchao")
    from llmtrain.parallel.float8 import Float8Training

    return Float8Training(recipe=recipe, fsdp_float8_all_gather=all_gather, tensor_parallel_styles=False)


@pytest.mark.parametrize("all_gather", [False, True], ids=["plain", "fsdp-float8-all-gather"])
def test_only_the_blocks_linear_layers_become_float8_and_names_stay(all_gather):
    model = tiny_gpt()
    names = [(n, p.shape) for n, p in model.named_parameters()]
    keys = list(model.state_dict())
    linear_weights = {n: p for n, p in model.named_parameters() if n.startswith("layers.") and p.dim() == 2}
    conversion = float8(all_gather=all_gather)
    conversion.convert(model)
    from torchao.float8.float8_linear import Float8Linear

    converted = sorted(n for n, m in model.named_modules() if isinstance(m, Float8Linear))
    assert converted == sorted(f"layers.{i}.{layer}" for i in range(2) for layer in BLOCK_LINEARS)
    assert conversion.converted == 12
    assert type(model.head) is nn.Linear and type(model.embed.tok) is nn.Embedding
    assert model.head.weight is model.embed.tok.weight  # the tie survives
    assert [(n, p.shape) for n, p in model.named_parameters()] == names
    assert list(model.state_dict()) == keys
    for n, p in model.named_parameters():
        if n in linear_weights and not all_gather:
            assert p is linear_weights[n]  # the same parameter objects: no copy, nothing to re-initialize
    assert "recipe tensorwise" in conversion.describe(compiled=True)
    assert "set train.compile=true" in conversion.describe(compiled=False)


def test_build_makes_float8_layers_first_and_keeps_the_names_of_a_bf16_build(tmp_path, one_rank):
    pytest.importorskip("torchao")
    from torchao.float8.float8_linear import Float8Linear

    from llmtrain.parallel.build import build_parallel_model
    from llmtrain.parallel.layout import ParallelDims
    from llmtrain.parallel.mesh import build_mesh

    built = {}
    for precision in ("bf16", "fp8"):
        cfg = compose_config([*TINY, f"precision={precision}", "recompute=full"])
        dims = ParallelDims.from_config(cfg)
        built[precision] = build_parallel_model(cfg, dims, build_mesh(dims, "cpu"), torch.device("cpu"))
    fp8 = built["fp8"]
    block = fp8.parts[0].layers["0"]
    assert type(block).__name__ == "CheckpointWrapper"  # recompute wrapped the block whose layers are float8
    assert isinstance(block._checkpoint_wrapped_module.mlp.fc, Float8Linear)
    assert fp8.float8.converted == 12 and built["bf16"].float8 is None
    bf16_params = dict(built["bf16"].named_parameters())
    assert [n for n, _ in fp8.named_parameters()] == list(bf16_params)
    for n, p in fp8.named_parameters():  # layout-independent init: the same weights whatever the precision
        assert torch.equal(p, bf16_params[n]), n


def test_saved_activation_count_reads_float8_tensors():
    pytest.importorskip("torchao")
    from torchao.float8.float8_scaling_utils import hp_tensor_to_float8_dynamic
    from torchao.float8.float8_training_tensor import LinearMMConfig

    from llmtrain.train.memory import SavedActivations

    x = hp_tensor_to_float8_dynamic(torch.randn(64, 32), torch.float8_e4m3fn, LinearMMConfig())
    count = SavedActivations([])
    count._pack(x)  # a wrapper tensor: its float8 data and its scale are counted, not its (absent) storage
    assert count.total == 64 * 32 * 1 + 4


# ---- checkpoints: fp8 <-> bf16 -------------------------------------------------------------------------------


def save(module: nn.Module, path) -> None:
    import torch.distributed.checkpoint as dcp

    from llmtrain.checkpoint.state import ModelState

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "assuming the intent is to save in a single process"
        dcp.save({"model": ModelState([module])}, checkpoint_id=str(path), no_dist=True)


def load(module: nn.Module, path) -> None:
    import torch.distributed.checkpoint as dcp

    from llmtrain.checkpoint.state import ModelState

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.load({"model": ModelState([module])}, checkpoint_id=str(path), no_dist=True)


def weights(module: nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in module.named_parameters()}


def test_an_fp8_checkpoint_holds_plain_tensors_under_the_bf16_names(tmp_path):
    from torch.distributed.checkpoint import FileSystemReader

    fp8 = tiny_gpt()
    float8(all_gather=True).convert(fp8)  # weights wrapped for FSDP2's float8 all-gather
    from llmtrain.checkpoint.state import ModelState

    assert {type(v) for v in ModelState([fp8]).state_dict().values()} <= {torch.Tensor, nn.Parameter}
    save(fp8, tmp_path / "fp8")
    bf16 = tiny_gpt()
    save(bf16, tmp_path / "bf16")
    keys = [set(FileSystemReader(str(tmp_path / k)).read_metadata().state_dict_metadata) for k in ("fp8", "bf16")]
    assert keys[0] == keys[1] and "model.layers.1.mlp.fc.weight" in keys[0]


def test_fp8_and_bf16_load_each_others_checkpoints(tmp_path):
    fp8 = tiny_gpt()
    float8(all_gather=True).convert(fp8)
    with torch.no_grad():
        for p in fp8.parameters():
            p.add_(0.5)  # away from the shared init, so a load that does nothing shows
    save(fp8, tmp_path / "fp8")
    bf16 = tiny_gpt()
    load(bf16, tmp_path / "fp8")
    expected = weights(fp8)
    assert all(torch.equal(p, expected[n]) for n, p in weights(bf16).items())

    bf16 = tiny_gpt(n_layers=2)
    with torch.no_grad():
        for p in bf16.parameters():
            p.sub_(0.25)
    save(bf16, tmp_path / "bf16")
    fp8 = tiny_gpt()
    float8(all_gather=True).convert(fp8)
    load(fp8, tmp_path / "bf16")
    expected = weights(bf16)
    assert all(torch.equal(p, expected[n]) for n, p in weights(fp8).items())


def test_a_trainer_run_in_fp8_resumes_in_bf16_and_exports(monkeypatch, tmp_path, one_rank, capsys):
    pytest.importorskip("torchao")
    from conftest import read_rows

    from llmtrain.checkpoint.export import export_checkpoint, read_safetensors

    simulate_gpu(monkeypatch)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    trainer(run_dir, "precision=fp8", "train.max_steps=4", "train.stop_at_step=2").train()
    out = capsys.readouterr().out
    assert "llmtrain: precision=fp8: 12 linear layers in float8 (recipe tensorwise), embedding and head in bf16" in out
    trainer(run_dir, "precision=bf16", "train.max_steps=4").train()
    assert "resumed from" in capsys.readouterr().out
    rows = [r for r in read_rows(run_dir) if "loss" in r]
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    exported = export_checkpoint(run_dir / "checkpoints" / "step-0000002", "safetensors", tmp_path / "export")
    assert exported is not None
    names = set(read_safetensors(tmp_path / "export" / "model.safetensors"))
    assert names == {n for n, _ in tiny_gpt().named_parameters()} - {"head.weight"}


# ---- llmtrain plan ---------------------------------------------------------------------------------------------


def plan(*overrides: str):
    pytest.importorskip("torchao")  # validation asks for it
    from llmtrain.plan.cli import plan_for

    cfg = compose_config(["model=gpt-1.3b", "hardware=h100", "train.micro_batch_size=4", *overrides])
    validate_here(cfg)
    return cfg, plan_for(cfg)


ONE_GPU = ["cluster.nproc_per_node=1", "train.global_batch_size=8"]


def test_plan_fp8_needs_less_memory_and_a_shorter_step_on_h100():
    from llmtrain.config.fp8 import float8_weights_per_block

    _, bf16 = plan(*ONE_GPU, "precision=bf16")
    cfg, fp8 = plan(*ONE_GPU, "precision=fp8")
    # No bf16 copy of the blocks' weights (2 bytes per block matrix parameter): 2.25 GiB at gpt-1.3b.
    saved = 2 * cfg.model.n_layers * float8_weights_per_block(cfg)
    assert bf16.peak_bytes_per_rank - fp8.peak_bytes_per_rank == pytest.approx(saved)
    assert saved / 2**30 == pytest.approx(2.25)
    # Faster, but at most by the float8 / bf16 peak ratio (1979 / 989): the casts are not counted.
    assert 1.5 < fp8.tokens_per_s / bf16.tokens_per_s < 1979 / 989
    assert fp8.step_time_s < bf16.step_time_s
    assert any(note.startswith("fp8: the blocks' float8 matmuls (86% of the FLOPs)") for note in fp8.notes)
    assert not any(note.startswith("fp8") for note in bf16.notes)


def test_plan_fp8_gathers_tensorwise_weights_in_float8():
    fsdp = ["cluster.nproc_per_node=8", "train.global_batch_size=32", "parallel.zero=2"]
    _, bf16 = plan(*fsdp, "precision=bf16")
    cfg, tensorwise = plan(*fsdp, "precision=fp8")
    _, rowwise = plan(*fsdp, "precision=fp8", "precision.fp8_recipe=rowwise")
    from llmtrain.config.fp8 import float8_weights_per_block

    one_byte_less = cfg.model.n_layers * float8_weights_per_block(cfg)
    gathered = [p.stages[0].state_bytes["gathered_params"] for p in (bf16, tensorwise, rowwise)]
    assert gathered[0] - gathered[1] == one_byte_less and gathered[2] == gathered[0]
    assert tensorwise.comm_bytes_per_step["dp"] < rowwise.comm_bytes_per_step["dp"] == bf16.comm_bytes_per_step["dp"]
    assert tensorwise.peak_bytes_per_rank < rowwise.peak_bytes_per_rank


def test_plan_fp8_float8_tensor_parallel_saves_activations_in_float8():
    tp = ["cluster.nproc_per_node=2", "train.global_batch_size=4", "parallel.tp=2", "parallel.sequence_parallel=true"]
    acts = {name: plan(*tp, *extra)[1].stages[0].activation_bytes for name, extra in (
        ("bf16", ["precision=bf16"]), ("tensorwise", ["precision=fp8"]),
        ("rowwise", ["precision=fp8", "precision.fp8_recipe=rowwise"]))}
    # rowwise saves bf16 inputs as bf16 does (less only by the weight copies); tensorwise's styles keep float8 ones
    assert acts["tensorwise"] < acts["rowwise"] < acts["bf16"]


# ---- training steps against bf16 -----------------------------------------------------------------------------

STEPS = 30


def train_losses(recipe: str | None) -> list[float]:
    """STEPS AdamW steps of a small GPT on fixed text (a multiplication table: the same bytes whatever this
    repository holds), under CPU bf16 autocast. torchao casts a float8 layer's input to bf16 only under CUDA
    autocast, so on CPU its inputs reach the float8 cast in fp32."""
    text = "".join(f"{i} x {j} = {i * j}\n" for i in range(1, 100) for j in range(1, 100)).encode()
    data = torch.tensor(list(text), dtype=torch.long)
    model = tiny_gpt()
    if recipe:
        float8(recipe).convert(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=False)
    g = torch.Generator().manual_seed(1)
    losses = []
    for _ in range(STEPS):
        starts = torch.randint(0, len(data) - 65, (8,), generator=g)
        x = torch.stack([data[s:s + 64] for s in starts])
        y = torch.stack([data[s + 1:s + 65] for s in starts])
        with torch.autocast("cpu", dtype=torch.bfloat16):
            logits = model(x)
        loss = F.cross_entropy(logits.float().flatten(0, 1), y.flatten())
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    return losses


@pytest.fixture(scope="module")
def bf16_losses() -> list[float]:
    return train_losses(None)


@pytest.mark.parametrize("recipe", ["tensorwise", "rowwise"])
def test_float8_training_tracks_bf16_on_cpu(recipe, bf16_losses):
    losses = train_losses(recipe)
    assert bf16_losses[-1] < bf16_losses[0] - 1.0  # the compared curves move
    worst = max(abs(a - b) / a for a, b in zip(bf16_losses, losses))
    assert 0 < worst <= PARITY, worst  # > 0: the layers did run in float8






