"""precision=fp8's rules on the config: shapes float8 kernels take, and which float8 features a layout uses.

Whether fp8 can run here (a GPU with float8 tensor cores, torchao installed) is a question about the machine:
llmtrain.hardware.fp8_device answers it for the device, the launcher's config probes ask it before launch, and each
worker asks again once its device is known.

What a layout uses (the trainer's float8 conversion and `llmtrain plan` read the same rules): only the tensorwise
recipe casts weights to float8 before FSDP2's all-gather (when parameters are sharded over more than one rank) and
has torchao's float8 tensor-parallel styles.
"""

from __future__ import annotations

from llmtrain.config.derived import ffn_dim, head_dim, kv_heads
from llmtrain.model.registry import family_of

FP8_MULTIPLE = 16  # torch._scaled_mm takes only matrix dimensions that are multiples of 16
FLOAT8_COLLECTIVES_RECIPE = "tensorwise"  # the one recipe whose tensors torchao casts before a collective


def shape_problem(cfg) -> str | None:
    """Why the blocks' float8 linear layers have a dimension float8 kernels cannot take: d_model, the attention
    width (n_heads x head_dim), the key/value width (n_kv_heads x head_dim), the dense MLP width, a sparse block's
    shared experts' width (computed whole on every rank), and under tensor parallel each rank's share of the split
    ones but d_model (column-parallel outputs, row-parallel inputs). The router and routed experts stay out of
    float8."""
    m, tp, spec = cfg.model, cfg.parallel.tp, family_of(cfg.model)
    shapes = [spec.block_shape(m, layer) for layer in range(m.n_layers)]
    attention, kv, mlp = m.n_heads * head_dim(m), kv_heads(m) * head_dim(m), ffn_dim(m)
    dense = not all(shape.sparse for shape in shapes)
    widths = [("model.d_model", m.d_model), ("the attention width (n_heads x head_dim)", attention)]
    if kv != attention:
        widths.append(("the key/value width (n_kv_heads x head_dim)", kv))
    if dense:
        widths.append((spec.mlp_width_key(m), mlp))
    widths += [("the shared experts' width (model.moe.n_shared_experts x expert width)", shared)
               for shared in sorted({shape.shared_ffn for shape in shapes if shape.shared_ffn})]
    if tp > 1:
        widths += [(f"the attention width per parallel.tp={tp} rank", attention // tp)]
        if kv != attention:
            widths.append((f"the key/value width per parallel.tp={tp} rank", kv // tp))
        if dense:
            widths.append((f"the MLP width per parallel.tp={tp} rank", mlp // tp))
    for what, n in widths:
        if n % FP8_MULTIPLE:
            return (f"fp8's float8 matmuls take only dimensions that are multiples of {FP8_MULTIPLE}, and {what} "
                    f"is {n}; change the model shape (or parallel.tp) or use precision=bf16")
    return None


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
    dense MLP's matrices (two with GELU, SwiGLU's three; biases stay in bf16), or in a sparse block the shared
    expert's (the router and the routed experts stay out of float8), averaged over the blocks; 0 unless
    precision=fp8."""
    if cfg.precision.name != "fp8":
        return 0
    m, spec = cfg.model, family_of(cfg.model)
    total = sum(_float8_weights(spec.block_shape(m, layer)) for layer in range(m.n_layers))
    return total // m.n_layers // cfg.parallel.tp


def _float8_weights(shape) -> int:
    mlp = (shape.mlp_in_matrices + 1) * shape.shared_ffn if shape.sparse else (shape.mlp_in_matrices + 1) * shape.ffn
    return shape.d_model * (2 * shape.attention + 2 * shape.kv + mlp)
