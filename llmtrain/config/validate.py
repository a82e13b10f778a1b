"""Cross-field rules checked before anything starts. Each failure names the key and the rule in one line."""

from __future__ import annotations

import dataclasses
import typing
from typing import Callable, Mapping

from omegaconf import DictConfig

from llmtrain.config.batch import division_problem
from llmtrain.config.derived import Derived, ffn_dim, kv_heads, padded_vocab_size, world_size
from llmtrain.config.errors import ConfigError
from llmtrain.config.schema import SINGLE_STAGE_SCHEDULES, V_SHAPED_SCHEDULES, LLMTrainConfig, ModelConfig
from llmtrain.launch.backends.traits import traits_of
from llmtrain.model.registry import FAMILIES, family, family_of


APEX_AMP_GONE = ("current NVIDIA apex has no amp (apex.amp was removed); precision=fp16 is the O1 recipe "
                 "(autocast + dynamic loss scaling starting at 2^16) and precision=bf16 the modern default "
                 "(no loss scaling needed)")
# Options that once existed: asking for one gets this answer instead of "no such option" (group -> option -> why).
RETIRED_OPTIONS = {"precision": {"apex-o1": APEX_AMP_GONE, "apex-o2": APEX_AMP_GONE}}


def _require(ok: bool, key: str, message: str) -> None:
    if not ok:
        raise ConfigError(key, message)


def _positive(cfg: DictConfig, *keys: str) -> None:
    for key in keys:
        value = cfg
        for part in key.split("."):
            value = value[part]
        _require(value is not None and value > 0, key, f"must be > 0 (got {value})")


def _non_negative(cfg: DictConfig, *keys: str) -> None:
    for key in keys:
        section, name = key.split(".")
        value = cfg[section][name]
        _require(value >= 0, key, f"must be >= 0 (got {value})")


Probe = Callable[[DictConfig], None]


def validate(cfg: DictConfig, probes: Mapping[str, Probe] | None = None) -> None:
    """Raise ConfigError for the first rule the config breaks. These are rules between keys only; `probes` (the
    launcher's checks of files, installed packages and devices) each run right after the section they are keyed
    by, so the first failure reported is the same whichever kind of check finds it."""
    for name, rule in SECTIONS:
        rule(cfg)
        if probes and name in probes:
            probes[name](cfg)


def _validate_choices(node, schema: type, prefix: str) -> None:
    """Every choice() field of the schema (see schema.py) holds one of its values, in set optional sections too."""
    hints = typing.get_type_hints(schema)
    for f in dataclasses.fields(schema):
        section = _section_type(f, hints[f.name])
        if section is not None and node[f.name] is not None:
            _validate_choices(node[f.name], section, f"{prefix}{f.name}.")
        elif "choices" in f.metadata:
            value, allowed = node[f.name], f.metadata["choices"]
            _require(value in allowed, f"{prefix}{f.name}",
                     f"must be one of {', '.join(str(a) for a in allowed if a is not None)} (got {value})")


def _section_type(f: dataclasses.Field, hint) -> type | None:
    """The dataclass a field holds (a section, or an Optional one such as model.moe), else None."""
    if dataclasses.is_dataclass(f.default_factory):
        return f.default_factory
    if typing.get_origin(hint) is not typing.Union:  # a list of sections (data.sources) is no section
        return None
    return next((t for t in typing.get_args(hint) if dataclasses.is_dataclass(t)), None)


def _validate_apex_layout(cfg: DictConfig) -> None:
    # Checked before apex itself, so nobody builds apex for a layout that cannot use it.
    p = cfg.parallel
    dtensor = [f"parallel.{key}={p[key]}" for key in ("dp", "tp") if p[key] > 1]
    _require(not dtensor, "optim.fused",
             f"apex's FusedAdam and FusedLayerNorm take plain tensors, and {' and '.join(dtensor)} hold the "
             "parameters as DTensors (FSDP2, tensor parallel); use optim.fused=auto or torch (every layout), or "
             "apex with parallel.dp=1 parallel.tp=1 (pipeline stages are fine)")


def _validate_recompute_and_optim(cfg: DictConfig) -> None:
    r, o = cfg.recompute, cfg.optim
    _require(r.every >= 1, "recompute.every", f"must be >= 1 (got {r.every})")
    if o.fused == "apex":
        _validate_apex_layout(cfg)


def _validate_profile(cfg: DictConfig) -> None:
    prof = cfg.profile
    if prof.steps is not None:
        steps = list(prof.steps)
        _require(len(steps) == 2 and 1 <= steps[0] <= steps[1], "profile.steps",
                 f"must be [A, B] with 1 <= A <= B (got {steps})")
    # Both run a torch.profiler, and only one can record at a time (CUDA measures the peak without it).
    _require(not (prof.memory and prof.steps is not None), "profile.memory",
             "cannot be combined with profile.steps (one torch.profiler at a time); set one of them")


def _validate_logging(cfg: DictConfig) -> None:
    _require(cfg.logging.tracker_start_timeout_s > 0, "logging.tracker_start_timeout_s",
             f"must be > 0 (got {cfg.logging.tracker_start_timeout_s})")


def _validate_model(cfg: DictConfig) -> None:
    m = cfg.model
    _positive(cfg, "model.n_layers", "model.n_heads", "model.d_model", "model.vocab_size", "model.seq_len",
              "model.vocab_pad_multiple")
    if m.head_dim is None:
        _require(m.d_model % m.n_heads == 0, "model.d_model",
                 f"d_model={m.d_model} must be divisible by model.n_heads={m.n_heads} (or set model.head_dim)")
    else:
        _positive(cfg, "model.head_dim")
    _require(0.0 <= m.dropout < 1.0, "model.dropout", f"must be in [0, 1) (got {m.dropout})")
    _require(m.init_std > 0, "model.init_std", f"must be > 0 (got {m.init_std})")
    _require(m.norm_eps > 0, "model.norm_eps", f"must be > 0 (got {m.norm_eps})")
    if m.ffn_dim is not None:
        _positive(cfg, "model.ffn_dim")
    _validate_arch_keys(m)
    family_of(m).validate(cfg, _require)
    _validate_moe(cfg)


def _validate_arch_keys(m: DictConfig) -> None:
    """A key only other families read (their spec's `keys`) keeps its schema default."""
    own = family_of(m)
    for other in map(family, FAMILIES):
        for name in other.keys:
            if name in own.keys:
                continue
            default = ModelConfig.__dataclass_fields__[name].default
            _require(m[name] == default, f"model.{name}",
                     f"is a {other.setting} setting and this model is {own.setting}; remove it (default "
                     f"{default}) or set {other.setting}")


def _validate_moe(cfg: DictConfig) -> None:
    m = cfg.model
    if m.moe is None:
        return
    sparse = [spec.setting for spec in map(family, FAMILIES) if spec.supports_moe]
    own = family_of(m)
    _require(own.supports_moe, "model.moe", f"{own.setting} has no mixture-of-experts blocks; remove model.moe"
             + (f" or use {' or '.join(sparse)}" if sparse else ""))
    e = m.moe
    _positive(cfg, "model.moe.n_experts", "model.moe.top_k", "model.moe.sparse_every")
    _require(e.top_k <= e.n_experts, "model.moe.top_k",
             f"must be <= model.moe.n_experts={e.n_experts} (got {e.top_k})")
    if e.expert_ffn_dim is not None:
        _positive(cfg, "model.moe.expert_ffn_dim")
    for name in ("n_shared_experts", "bias_update_rate", "router_aux_loss_coef", "router_z_loss_coef"):
        _require(e[name] >= 0, f"model.moe.{name}", f"must be >= 0 (got {e[name]})")
    _require(0 <= e.n_dense_layers <= m.n_layers, "model.moe.n_dense_layers",
             f"must be in [0, model.n_layers={m.n_layers}] (got {e.n_dense_layers})")


def _validate_parallel(cfg: DictConfig) -> None:
    p, m = cfg.parallel, cfg.model
    _positive(cfg, "parallel.tp", "parallel.pp", "parallel.virtual_stages", "parallel.cp")
    world, cp = world_size(cfg), p.cp
    if p.dp is None:
        _require(world % (p.tp * p.pp * cp) == 0, "parallel.tp",
                 f"world size {world} (cluster.nnodes x cluster.nproc_per_node) is not divisible by "
                 + (f"parallel.tp x parallel.pp x parallel.cp = {p.tp * p.pp * cp}" if cp > 1 else
                    f"parallel.tp x parallel.pp = {p.tp * p.pp}"))
    _positive(cfg, "parallel.dp")
    if cp > 1:
        _require(p.dp * cp * p.tp * p.pp == world, "parallel.dp",
                 f"dp x cp x tp x pp = {p.dp} x {cp} x {p.tp} x {p.pp} = {p.dp * cp * p.tp * p.pp} must equal the "
                 f"world size cluster.nnodes x cluster.nproc_per_node = {cfg.cluster.nnodes} x "
                 f"{cfg.cluster.nproc_per_node} = {world}")
    else:
        _require(p.dp * p.tp * p.pp == world, "parallel.dp",
                 f"dp x tp x pp = {p.dp} x {p.tp} x {p.pp} = {p.dp * p.tp * p.pp} must equal the world size "
                 f"cluster.nnodes x cluster.nproc_per_node = {cfg.cluster.nnodes} x {cfg.cluster.nproc_per_node} = "
                 f"{world}")

    _require(m.n_heads % p.tp == 0, "parallel.tp", f"tp={p.tp} must divide model.n_heads={m.n_heads}")
    _require(m.d_model % p.tp == 0, "parallel.tp", f"tp={p.tp} must divide model.d_model={m.d_model}")
    kv = kv_heads(m)
    _require(kv % p.tp == 0, "model.n_kv_heads",
             f"{kv} kv heads cannot be split over parallel.tp={p.tp}; use a tp that divides n_kv_heads")
    mlp, spec = ffn_dim(m), family_of(m)
    # A sparse block's experts are not split over tp (computed whole on each rank); a dense MLP is.
    if not all(spec.block_shape(m, layer).sparse for layer in range(m.n_layers)):
        _require(mlp % p.tp == 0, "parallel.tp", f"tp={p.tp} must divide the MLP width {mlp} (model.ffn_dim)")
    padded = padded_vocab_size(m)
    _require(padded % p.tp == 0, "model.vocab_pad_multiple",
             f"the padded vocabulary ({m.vocab_size} rounded up to a multiple of {m.vocab_pad_multiple} = "
             f"{padded}) must be divisible by parallel.tp={p.tp}; use a vocab_pad_multiple divisible by tp")
    if p.sequence_parallel:
        _require(m.seq_len % (p.tp * cp) == 0, "parallel.sequence_parallel",
                 f"sequence parallel needs model.seq_len={m.seq_len} divisible by parallel.tp={p.tp}"
                 + (f" x parallel.cp={cp}" if cp > 1 else ""))
    _validate_context_parallel(cfg)

    if p.dp_shard is not None:
        _require(p.dp_shard > 0 and p.dp % p.dp_shard == 0, "parallel.dp_shard",
                 f"dp_shard={p.dp_shard} must divide parallel.dp={p.dp}")
        _require(p.zero in (2, 3) or p.dp_shard == 1, "parallel.dp_shard",
                 "hybrid sharding needs parallel.zero=2 or 3 (zero=0 replicates everything)")

    _validate_expert_parallel(cfg)
    v = p.virtual_stages
    if p.pp_schedule in SINGLE_STAGE_SCHEDULES:
        _require(v == 1, "parallel.virtual_stages",
                 f"schedule {p.pp_schedule} runs one stage per rank; use interleaved_1f1b for virtual_stages={v}")
    elif p.pp > 1:
        need = 2 if p.pp_schedule in V_SHAPED_SCHEDULES else None
        if need:
            _require(v == need, "parallel.virtual_stages",
                     f"schedule {p.pp_schedule} needs exactly virtual_stages=2 (got {v})")
        else:
            _require(v >= 2, "parallel.virtual_stages",
                     f"schedule {p.pp_schedule} needs virtual_stages >= 2 (got {v})")
    stages = p.pp * v
    if p.pp_layers is not None:
        layers = list(p.pp_layers)
        _require(len(layers) == stages, "parallel.pp_layers",
                 f"needs one entry per stage: pp x virtual_stages = {stages} (got {len(layers)})")
        _require(all(n >= 1 for n in layers), "parallel.pp_layers", f"every stage needs >= 1 layer (got {layers})")
        _require(sum(layers) == m.n_layers, "parallel.pp_layers",
                 f"layers per stage sum to {sum(layers)}, model.n_layers is {m.n_layers}")
    else:
        _require(stages <= m.n_layers, "parallel.pp",
                 f"pp x virtual_stages = {stages} stages but model.n_layers is only {m.n_layers}")
        _require(m.n_layers % stages == 0, "parallel.pp",
                 f"model.n_layers={m.n_layers} is not divisible by pp x virtual_stages = {stages} "
                 "(give an explicit split with parallel.pp_layers)")


def _validate_context_parallel(cfg: DictConfig) -> None:
    p, m = cfg.parallel, cfg.model
    if p.cp == 1:
        return
    _require(m.seq_len % (2 * p.cp) == 0, "parallel.cp",
             f"cp={p.cp} splits each sequence into 2 x cp = {2 * p.cp} equal chunks: model.seq_len={m.seq_len} "
             f"is not divisible by {2 * p.cp}")
    _require(p.get("ep", 1) == 1, "parallel.cp",
             f"cp={p.cp} with expert parallel (parallel.ep={p.get('ep', 1)}) is not supported yet: the experts "
             "would need their gradients averaged over the cp ranks too; use one of them")


def _validate_expert_parallel(cfg: DictConfig) -> None:
    p, m = cfg.parallel, cfg.model
    ep = p.get("ep", 1)
    _require(ep >= 1, "parallel.ep", f"must be >= 1 (got {ep})")
    if ep == 1:
        return
    _require(m.moe is not None, "parallel.ep",
             f"ep={ep} splits a mixture of experts' experts, but model.moe is null (a dense model)")
    n = m.moe.n_experts
    _require(n % ep == 0, "parallel.ep", f"ep={ep} must divide model.moe.n_experts={n}")
    if p.zero == 0:
        _require(p.dp % ep == 0, "parallel.ep",
                 f"ep={ep} must divide parallel.dp={p.dp} (expert parallel is carved from the data-parallel ranks)")
    else:
        shard = p.dp_shard or p.dp
        _require(shard % ep == 0, "parallel.ep",
                 f"ep={ep} must divide the ZeRO shard group parallel.dp_shard={shard} "
                 "(expert parallel is carved from its ranks)")


def _validate_loss(cfg: DictConfig) -> None:
    t = cfg.train
    if t.loss_chunk_tokens is not None:
        _require(t.loss_chunk_tokens > 0, "train.loss_chunk_tokens", f"must be > 0 or null (got {t.loss_chunk_tokens})")
    if t.attention in ("cudnn", "efficient"):
        _require(cfg.device != "cpu", "train.attention",
                 f"{t.attention} attention runs on CUDA only (device=cpu); use train.attention=auto, flash or math")
    if t.loss == "liger":
        # Its Triton kernel runs on CUDA only and takes the whole vocabulary's weight.
        _require(cfg.device != "cpu", "train.loss", "liger runs on CUDA only (device=cpu); use train.loss=chunked")
        _require(cfg.parallel.tp == 1, "train.loss",
                 f"liger takes the whole vocabulary, and parallel.tp={cfg.parallel.tp} shards it; use "
                 "train.loss=chunked (vocabulary-parallel) or auto")
        _require(cfg.parallel.pp == 1, "train.loss",
                 f"liger scales its kept gradients in place, which a pipeline schedule that runs a loss's backward "
                 f"twice would scale twice (parallel.pp={cfg.parallel.pp}); use train.loss=chunked or auto")


def _validate_train(cfg: DictConfig) -> None:
    t, p = cfg.train, cfg.parallel
    _positive(cfg, "train.max_steps", "train.micro_batch_size", "train.global_batch_size", "train.lr",
               "train.log_interval")
    _non_negative(cfg, "train.min_lr", "train.warmup_steps", "train.weight_decay", "train.grad_clip",
                  "train.eval_interval", "train.eval_steps", "train.max_bad_steps")
    if t.stop_at_step is not None:
        _require(t.stop_at_step > 0, "train.stop_at_step", f"must be > 0 (got {t.stop_at_step})")
    s = t.spike
    _require(s.window >= 2, "train.spike.window", f"must be >= 2 (got {s.window})")
    _require(s.sigma is None or s.sigma > 0, "train.spike.sigma", f"must be > 0 or null (got {s.sigma})")
    for key in ("margin_steps", "max_rollbacks"):
        _require(s[key] >= 0, f"train.spike.{key}", f"must be >= 0 (got {s[key]})")
    _require(t.min_lr <= t.lr, "train.min_lr", f"min_lr={t.min_lr} must not exceed train.lr={t.lr}")
    for key in ("beta1", "beta2"):
        _require(0.0 <= t[key] < 1.0, f"train.{key}", f"must be in [0, 1) (got {t[key]})")
    problem = division_problem(t.global_batch_size, t.micro_batch_size, p.dp)
    _require(problem is None, "train.global_batch_size", problem)
    _validate_loss(cfg)
    if p.pp > 1:
        micro = Derived.of(cfg).micro_batches
        _require(micro >= p.pp, "train.global_batch_size",
                 f"pipeline needs at least pp={p.pp} micro-batches per step to fill its stages; "
                 f"global_batch_size / (micro_batch_size x dp) = {micro}")
        if p.pp_schedule not in SINGLE_STAGE_SCHEDULES + V_SHAPED_SCHEDULES:
            _require(micro % p.pp == 0, "train.global_batch_size",
                     f"schedule {p.pp_schedule} needs micro-batches per step ({micro}) divisible by pp={p.pp}")


def _validate_data(cfg: DictConfig) -> None:
    """The data source's keys; what its files hold is the launcher's probe (they may not exist here yet)."""
    d, m = cfg.data, cfg.model
    _require(0.0 < d.val_fraction < 1.0, "data.val_fraction", f"must be in (0, 1) (got {d.val_fraction})")
    if d.name == "memmap":
        _require(bool(d.path) and d.path != "???", "data.path",
                 "memmap data needs data.path (a token file or shard folder from `llmtrain data prepare`)")
    if d.name == "stdlib":
        _require(bool(d.path), "data.path", "the stdlib corpus needs a data.path to build into")
        _require(m.vocab_size >= 256, "model.vocab_size",
                 f"byte-level stdlib data has 256 token ids; vocab_size={m.vocab_size} is too small")
        _positive(cfg, "data.max_bytes")


def _validate_hardware(cfg: DictConfig) -> None:
    """The peak table's keys and values, the compute capability's form, and for a named GPU profile the compute
    dtype (hardware=auto checks it in the worker, once the GPU is known)."""
    from llmtrain.config.hardware_keys import PEAK_DTYPES, check_dtype, parse_capability

    hw = cfg.hardware
    for dtype, tflops in hw.peak_tflops.items():
        key = f"hardware.peak_tflops.{dtype}"
        _require(dtype in PEAK_DTYPES, key, f"unknown dtype '{dtype}' (choose from {', '.join(PEAK_DTYPES)})")
        _require(tflops > 0, key, f"must be > 0 (got {tflops})")
    try:
        parse_capability(hw.compute_capability)
    except ValueError as e:
        raise ConfigError("hardware.compute_capability", str(e)) from None
    if hw.name != "auto":
        check_dtype(dict(hw.peak_tflops), hw.name, cfg.precision.compute_dtype)


def _validate_precision(cfg: DictConfig) -> None:
    pr = cfg.precision
    if pr.name == "fp8":  # before the hardware rules, whose answer for a GPU without bf16 would be fp16
        from llmtrain.config.fp8 import shape_problem

        problem = shape_problem(cfg)
        _require(problem is None, "precision", problem)
    if pr.name == "fp16":
        _require(pr.init_scale > 0, "precision.init_scale", f"must be > 0 (got {pr.init_scale})")
        _require(pr.growth_factor > 1.0, "precision.growth_factor", f"must be > 1 (got {pr.growth_factor})")
        _require(0.0 < pr.backoff_factor < 1.0, "precision.backoff_factor",
                 f"must be in (0, 1) (got {pr.backoff_factor})")
        _require(pr.growth_interval > 0, "precision.growth_interval", f"must be > 0 (got {pr.growth_interval})")


def _validate_cluster(cfg: DictConfig) -> None:
    c = cfg.cluster
    _positive(cfg, "cluster.nnodes", "cluster.nproc_per_node", "doctor.connect_timeout_s")
    _require(0 <= c.node_rank < c.nnodes, "cluster.node_rank", f"must be in [0, {c.nnodes}) (got {c.node_rank})")
    _require(c.min_nnodes is None or 1 <= c.min_nnodes <= c.nnodes, "cluster.min_nnodes",
             f"must be in [1, cluster.nnodes={c.nnodes}], or null for cluster.nnodes (got {c.min_nnodes})")
    _require(0 <= c.master_port < 65536, "cluster.master_port", f"must be a port number (got {c.master_port})")
    _require(cfg.launch.max_restarts >= 0, "launch.max_restarts", f"must be >= 0 (got {cfg.launch.max_restarts})")
    _require(cfg.launch.pg_timeout_s > 0, "launch.pg_timeout_s", f"must be > 0 (got {cfg.launch.pg_timeout_s})")
    _require(cfg.launch.hang_timeout_s > 0, "launch.hang_timeout_s",
             f"must be > 0 (got {cfg.launch.hang_timeout_s})")
    _require(cfg.launch.hang_evidence_wait_s > 0, "launch.hang_evidence_wait_s",
             f"must be > 0 (got {cfg.launch.hang_evidence_wait_s})")
    _require(cfg.launch.rendezvous_timeout_s > 0, "launch.rendezvous_timeout_s",
             f"must be > 0 (got {cfg.launch.rendezvous_timeout_s})")
    ratio = cfg.launch.max_memory_ratio
    _require(ratio is None or ratio >= 1.0, "launch.max_memory_ratio", f"must be >= 1.0 or null (got {ratio})")
    factor = cfg.launch.straggler_factor
    _require(factor == 0 or factor > 1, "launch.straggler_factor", f"must be > 1, or 0 to turn detection off (got {factor})")
    _require(cfg.launch.straggler_intervals >= 1, "launch.straggler_intervals",
             f"must be >= 1 (got {cfg.launch.straggler_intervals})")
    _require(cfg.checkpoint.interval >= 0, "checkpoint.interval", f"must be >= 0 (got {cfg.checkpoint.interval})")
    _require(cfg.checkpoint.interval_minutes >= 0, "checkpoint.interval_minutes",
             f"must be >= 0 (got {cfg.checkpoint.interval_minutes}); 0 saves by step count only")
    _require(c.bad_node_failures >= 1, "cluster.bad_node_failures", f"must be >= 1 (got {c.bad_node_failures})")
    _non_negative(cfg, "cluster.max_starts_without_progress")
    _require(cfg.checkpoint.keep >= 1, "checkpoint.keep", f"must be >= 1 (got {cfg.checkpoint.keep})")
    _check_checkpoint_location(cfg.checkpoint)
    if traits_of(c.name).uses_hostfile:
        _require(c.hostfile not in (None, "???"), "cluster.hostfile",
                 "cluster=ssh needs a hostfile: cluster.hostfile=FILE (lines of 'hostname slots=N')")


# In the order they run: the cluster first (the world size every later rule divides).
SECTIONS: tuple[tuple[str, Probe], ...] = (
    ("choices", lambda cfg: _validate_choices(cfg, LLMTrainConfig, "")),
    ("cluster", _validate_cluster),
    ("model", _validate_model),
    ("parallel", _validate_parallel),
    ("train", _validate_train),
    ("data", _validate_data),
    ("precision", _validate_precision),
    ("hardware", _validate_hardware),
    ("optim", _validate_recompute_and_optim),
    ("profile", _validate_profile),
    ("logging", _validate_logging),
)


def _check_checkpoint_location(ckpt) -> None:
    """checkpoint.dir and the fast tier: shape only here; the launch probes the store itself (a write)."""
    _require(ckpt.upload_every >= 1, "checkpoint.upload_every", f"must be >= 1 (got {ckpt.upload_every})")
    for key in ("dir", "local_dir"):
        value = ckpt.get(key)
        _require(value is None or (isinstance(value, str) and value.strip() != ""), f"checkpoint.{key}",
                 "must be a path or a URI, or null")
    local = ckpt.get("local_dir")
    _require(local is None or "://" not in local or local.startswith("file://"), "checkpoint.local_dir",
             f"must be a local or shared folder, not an object store ({local}); the store goes in checkpoint.dir")
    _require(local is None or ckpt.get("dir") is not None, "checkpoint.local_dir",
             "is a fast tier in front of checkpoint.dir, which is null; set checkpoint.dir to where the uploads go")
