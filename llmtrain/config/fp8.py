"""precision=fp8's rules: whether it can run here, and which float8 features a layout uses.

Whether it can run: a GPU with float8 tensor cores, torchao installed, shapes float8 kernels take. validate.py asks
before launch, from the config: device=cpu, hardware=cpu, a GPU profile below compute capability 8.9, and with
hardware=auto on cluster=local this node's own device (it runs the workers). With hardware=auto on ssh or slurm
the launcher's node may have no GPU at all, so each worker asks again once its device is known (check_fp8_node),
with the same message. No torch import unless this node's device is probed.

What a layout uses (the trainer's float8 conversion and `llmtrain plan` read the same rules): only the tensorwise
recipe casts weights to float8 before FSDP2's all-gather (when parameters are sharded over more than one rank) and
has torchao's float8 tensor-parallel styles.
"""

from __future__ import annotations

from llmtrain.config.derived import ffn_dim, head_dim, kv_heads
from llmtrain.config.errors import ConfigError
from llmtrain.hardware.profiles import parse_capability

FP8_MIN_CAPABILITY = (8, 9)  # float8 tensor cores: Ada (8.9), Hopper (9.0), Blackwell (10.0)
FP8_MULTIPLE = 16  # torch._scaled_mm takes only matrix dimensions that are multiples of 16
FLOAT8_COLLECTIVES_RECIPE = "tensorwise"  # the one recipe whose tensors torchao casts before a collective
FP8_INSTALL = ("fp8 needs torchao (its float8 training), which is not installed: pip install 'llmtrain[fp8]' "
               "(in a checkout: pip install -e '.[fp8]')")


def _refusal(where: str) -> str:
    return (f"fp8 needs float8 tensor cores (an NVIDIA GPU of compute capability 8.9 or newer: Ada, Hopper, "
            f"Blackwell; or an AMD MI300X), and {where}; use precision=bf16")


def configured_device_problem(cfg) -> str | None:
    """Why the configured device cannot run fp8, as far as the config (and, for cluster=local with
    hardware=auto, this node) tells; None when it can or only the workers can tell."""
    hw = cfg.hardware
    if cfg.device == "cpu":
        return _refusal("device=cpu trains on the CPU")
    if hw.name == "cpu":
        return _refusal("hardware=cpu is a CPU")
    if hw.name != "auto":
        try:
            capability = parse_capability(hw.compute_capability)
        except ValueError:
            return None  # the hardware rules name the malformed value
        if capability is not None and capability < FP8_MIN_CAPABILITY:
            return _refusal(f"hardware={hw.name} has compute capability {hw.compute_capability}")
        if hw.peak_tflops and "float8" not in hw.peak_tflops:  # e.g. an AMD GPU without fp8 (no capability)
            return _refusal(f"hardware={hw.name} has no float8 matmuls")
        return None
    if cfg.cluster.name == "local":
        return node_device_problem(cfg.device)
    return None


def node_device_problem(device_setting: str, device_type: str | None = None) -> str | None:
    """Why this node's device cannot run fp8: `device_type` is the worker's resolved device ("cpu", "cuda"); None
    means what device=auto would find here."""
    from llmtrain.hardware.profiles import device_capability, device_name

    name = device_name(device_type)
    if name is None:
        here = "" if device_setting == "cpu" else " here (this node has no CUDA device)"
        return _refusal(f"device={device_setting} trains on the CPU{here}")
    capability = device_capability()  # None on ROCm: torchao picks its float8 variant there
    if capability is not None and parse_capability(capability) < FP8_MIN_CAPABILITY:
        return _refusal(f"the detected GPU ({name}) has compute capability {capability}")
    return None


def check_fp8_node(cfg, device_type: str) -> None:
    """The worker's check at start, once its device is known: ConfigError (key `precision`) if it cannot run fp8."""
    if cfg.precision.name != "fp8":
        return
    problem = node_device_problem(cfg.device, device_type)
    if problem:
        raise ConfigError("precision", problem)


def _mlp_label(m) -> str:
    return "the MLP width (4 x d_model)" if m.arch == "gpt2" and m.ffn_dim is None else "the MLP width (model.ffn_dim)"


def shape_problem(cfg) -> str | None:
    """Why the blocks' linear layers have a dimension float8 kernels cannot take: d_model, the attention width
    (n_heads x head_dim), Llama's key/value width (n_kv_heads x head_dim), the MLP width, and under tensor parallel
    each rank's share of all but d_model (column-parallel outputs, row-parallel inputs)."""
    m, tp = cfg.model, cfg.parallel.tp
    attention, kv, mlp = m.n_heads * head_dim(m), kv_heads(m) * head_dim(m), ffn_dim(m)
    widths = [("model.d_model", m.d_model), ("the attention width (n_heads x head_dim)", attention)]
    if kv != attention:
        widths.append(("the key/value width (n_kv_heads x head_dim)", kv))
    widths.append((_mlp_label(m), mlp))
    if tp > 1:
        widths += [(f"the attention width per parallel.tp={tp} rank", attention // tp)]
        if kv != attention:
            widths.append((f"the key/value width per parallel.tp={tp} rank", kv // tp))
        widths.append((f"the MLP width per parallel.tp={tp} rank", mlp // tp))
    for what, n in widths:
        if n % FP8_MULTIPLE:
            return (f"fp8's float8 matmuls take only dimensions that are multiples of {FP8_MULTIPLE}, and {what} "
                    f"is {n}; change the model shape (or parallel.tp) or use precision=bf16")
    return None


def torchao_missing() -> str | None:
    """Why torchao cannot be used, or None. Looked up without importing it (it imports torch)."""
    from importlib.util import find_spec

    return FP8_INSTALL if find_spec("torchao") is None else None


def fp8_problem(cfg) -> str | None:
    """The first reason precision=fp8 cannot run with this config: device, then shapes, then torchao."""
    return configured_device_problem(cfg) or shape_problem(cfg) or torchao_missing()


def float8_all_gather(cfg, dims) -> bool:
    """FSDP2 all-gathers the float8 layers' weights in float8 (cast before the gather, half of bf16's bytes)."""
    return (cfg.precision.name == "fp8" and cfg.precision.fp8_recipe == FLOAT8_COLLECTIVES_RECIPE and dims.dp > 1
            and dims.dp_shard > 1)


def float8_tensor_parallel(cfg) -> bool:
    """Tensor parallel uses torchao's float8 styles (inputs cast to float8 before their collectives)."""
    return (cfg.precision.name == "fp8" and cfg.precision.fp8_recipe == FLOAT8_COLLECTIVES_RECIPE
            and cfg.parallel.tp > 1)


def float8_weights_per_block(cfg) -> int:
    """Weights of one block's float8 layers on one tensor-parallel rank: q, k, v, the attention projection and the
    MLP's matrices (two for gpt2, SwiGLU's three for llama; biases stay in bf16); 0 unless precision=fp8."""
    if cfg.precision.name != "fp8":
        return 0
    m = cfg.model
    attention, kv = m.n_heads * head_dim(m), kv_heads(m) * head_dim(m)
    mlp_matrices = 3 if m.arch == "llama" else 2
    return m.d_model * (2 * attention + 2 * kv + mlp_matrices * ffn_dim(m)) // cfg.parallel.tp
