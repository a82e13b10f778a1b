"""Typed schema of the resolved config, and the one home of every default and every allowed value.

Composed YAML is merged onto these dataclasses (OmegaConf structured configs), so an unknown key or a value of the
wrong type fails with the key's full name before anything starts. A field with a fixed set of values declares it
with `choice()` (OmegaConf 2.3 takes neither Literal nor Enums of values such as "1f1b"); validate.py checks every
such field, and code that needs the set reads it with `choices_of()`. Cross-field rules live in validate.py.
Group YAML files (configs/) hold only what their option changes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional

from omegaconf import MISSING

from llmtrain.config.schema_choice import choice, choices_of  # noqa: F401 (re-exported)
from llmtrain.config.schema_cluster import ClusterConfig, ContainerConfig  # noqa: F401 (re-exported)
from llmtrain.model.registry import FAMILIES


# Pipeline schedules that run one stage per rank; every other schedule runs several (parallel.virtual_stages).
SINGLE_STAGE_SCHEDULES = ("gpipe", "1f1b")
V_SHAPED_SCHEDULES = ("zbv", "dualpipe_v")  # exactly two stages per rank
DTYPES = ("float32", "bfloat16", "float16")


@dataclass
class RopeScalingConfig:
    """Llama 3.1's rotary frequency scaling (transformers' rope_type "llama3"): wavelengths longer than
    original_max_position_embeddings / low_freq_factor are divided by factor, shorter than
    original_max_position_embeddings / high_freq_factor kept, those between interpolated."""

    factor: float = 8.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192


@dataclass
class MoEConfig:
    """A mixture-of-experts MLP in the sparse layers (llmtrain/model/moe/): a router picks top_k of n_experts
    SwiGLU experts per token; dropless."""

    n_experts: int = 8
    top_k: int = 2
    # Hidden width of one expert; null = the model's ffn_dim.
    expert_ffn_dim: Optional[int] = None
    # Experts every token goes through besides the routed ones, as one SwiGLU MLP n_shared_experts x
    # expert_ffn_dim wide; 0 = none.
    n_shared_experts: int = 0
    # Scale the top_k routing weights of a token to sum to 1.
    norm_topk_prob: bool = True
    # softmax | sigmoid: how router logits become scores.
    score_func: str = choice("softmax", "softmax", "sigmoid")
    # > 0: DeepSeek-V3's auxiliary-loss-free balancing: a per-expert bias added to the scores for choosing experts
    # only, nudged after each step by this rate x sign(mean load - the expert's load).
    bias_update_rate: float = 0.0
    # Weight of the load-balancing loss (Switch/Qwen3: n_experts x sum over experts of token share x mean score).
    router_aux_loss_coef: float = 0.001
    # Weight of the router z-loss: mean of logsumexp(logits)^2.
    router_z_loss_coef: float = 0.0
    # The first layers stay dense.
    n_dense_layers: int = 0
    # Layer i is sparse iff i >= n_dense_layers and (i + 1) % sparse_every == 0 (Qwen3-MoE's decoder_sparse_step).
    sparse_every: int = 1
    # auto (torch._grouped_mm on a CUDA device of compute capability >= 9.0, a loop over experts elsewhere) | on
    # (require it) | off (the loop).
    grouped_mm: str = choice("auto", "auto", "on", "off")


@dataclass
class ModelConfig:
    name: str = "gpt-tiny"
    # The model family (llmtrain/model/<arch>/; docs/models.md). gpt2: learned positions, LayerNorm, GELU MLP,
    # biases, tied head. llama: rotary positions, RMSNorm, SwiGLU, grouped-query attention, no biases, tied or
    # untied head.
    arch: str = choice("gpt2", *FAMILIES)
    n_layers: int = 4
    n_heads: int = 4
    d_model: int = 128
    vocab_size: int = 256
    # Embedding rows are vocab_size rounded up to this multiple (50257 -> 50304): tensor parallel can split them
    # for any power-of-two tp up to the multiple, the matmuls get friendlier shapes, and the shape does not
    # depend on the layout. The extra ids never occur in data. 1 = no padding.
    vocab_pad_multiple: int = 128
    seq_len: int = 128
    # Per-head width; null = d_model / n_heads. GPT-3 1.3B's table has 24 heads of 128 with d_model 2048.
    head_dim: Optional[int] = None
    # Hidden width of the MLP; null = gpt2: 4 x d_model, llama: from ffn_dim_multiplier and multiple_of
    # (config/derived.py).
    ffn_dim: Optional[int] = None
    # Epsilon of the LayerNorms (gpt2) or RMSNorms (llama).
    norm_eps: float = 1.0e-5
    # gpt2 only (llama has no dropout).
    dropout: float = 0.0
    # llama only. Key/value heads; null = n_heads, fewer = grouped-query attention (1 = multi-query).
    n_kv_heads: Optional[int] = None
    # llama only. Rotary base, and Llama 3.1's frequency scaling (null = none).
    rope_theta: float = 10000.0
    rope_scaling: Optional[RopeScalingConfig] = None
    # llama only. Llama's MLP width when ffn_dim is null: int(2 x 4 x d_model / 3), times ffn_dim_multiplier when
    # set, rounded up to a multiple of multiple_of.
    ffn_dim_multiplier: Optional[float] = None
    multiple_of: int = 256
    # llama only (gpt2 always ties): the output head shares the token embedding's weight.
    tie_embeddings: bool = True
    init_std: float = 0.02
    # A Hugging Face folder or an llmtrain safetensors export to start from; null = random init (docs/models.md).
    init_from: Optional[str] = None
    # Mixture of experts in the sparse layers (a family that supports it); null = dense.
    moe: Optional[MoEConfig] = None


@dataclass
class ParallelConfig:
    # null = world size / (tp * pp * cp)
    dp: Optional[int] = None
    tp: int = 1
    pp: int = 1
    sequence_parallel: bool = False
    pp_schedule: str = choice("1f1b", *SINGLE_STAGE_SCHEDULES, "interleaved_1f1b", "looped_bfs", "zero_bubble",
                              *V_SHAPED_SCHEDULES)
    virtual_stages: int = 1
    # Layers per pipeline stage (length pp * virtual_stages); null = as even as possible.
    pp_layers: Optional[List[int]] = None
    # 0 = replicate (DDP-like), 2 = shard grads + optimizer state, 3 = also shard parameters.
    zero: int = choice(0, 0, 2, 3)
    # Size of the sharding group inside dp (hybrid sharding); null = all of dp.
    dp_shard: Optional[int] = None
    # Expert parallel: a mixture of experts' experts split over this many dp ranks; 1 = none (docs/parallelism.md).
    ep: int = 1
    # Context parallel: each sequence split over this many ranks; 1 = none (docs/parallelism.md).
    cp: int = 1


# train.global_batch_size=null: the same samples per step for any layout (16 sequences: gpt-tiny's demo on a CPU).
DEFAULT_GLOBAL_BATCH_SIZE = 16
# train.micro_batch_size=null: at most this many samples per micro-batch.
MAX_AUTO_MICRO_BATCH_SIZE = 8


@dataclass
class SpikeConfig:
    # What a loss spike does: stop (a streak of train.max_bad_steps non-finite steps, or a sigma spike, stops the
    # run without saving), rollback (reload the newest checkpoint before it, skip its samples, go on) or warn.
    policy: str = choice("stop", "stop", "rollback", "warn")
    metric: str = choice("loss", "loss", "grad_norm")
    # Trailing steps whose mean and standard deviation the rule compares against; no verdict before it is full.
    window: int = 50
    # A step whose metric exceeds mean + sigma x std of the window is a spike; null = only non-finite streaks.
    sigma: Optional[float] = None
    # Steps' worth of samples skipped past the spike step on a rollback.
    margin_steps: int = 10
    # Rollbacks a run may take (over every launch of it); the next spike stops the run.
    max_rollbacks: int = 3


@dataclass
class TrainConfig:
    max_steps: int = 300
    # Stop this launch (with a checkpoint) once this step is reached; the schedule still runs to max_steps and
    # the next launch resumes. For time-sliced allocations; null = run to max_steps.
    stop_at_step: Optional[int] = None
    # Samples per micro-batch on each dp rank; null = the largest of at most 8 that divides a dp rank's share of
    # the global batch (with a pipeline: leaving 2 x pp x virtual_stages micro-batches). See config/batch.py.
    micro_batch_size: Optional[int] = None
    # Samples per optimizer step, whatever the layout; null = DEFAULT_GLOBAL_BATCH_SIZE on a fresh run, the
    # checkpoint's value on a resume. Each dp rank accumulates global / (micro_batch_size x dp) micro-batches.
    global_batch_size: Optional[int] = None
    lr: float = 1.0e-3
    min_lr: float = 1.0e-4
    warmup_steps: int = 20
    weight_decay: float = 0.1
    beta1: float = 0.9
    beta2: float = 0.95
    eps: float = 1.0e-8
    grad_clip: float = 1.0
    seed: int = 1234
    log_interval: int = 10
    eval_interval: int = 100
    eval_steps: int = 4
    max_bad_steps: int = 5
    spike: SpikeConfig = field(default_factory=SpikeConfig)
    # torch.compile each transformer block (in place, parameter names unchanged).
    compile: bool = False
    # How the output head and its fp32 cross entropy run: chunked (over chunks of tokens, never the whole logits;
    # every layout), liger (Liger-Kernel's fused kernel: CUDA, tp=1, pp=1, the liger extra), full (the whole logits, then
    # the loss), auto (liger where it applies and is installed, else chunked).
    loss: str = choice("auto", "auto", "chunked", "liger", "full")
    # train.loss=chunked: tokens per chunk; null = a chunk's fp32 logits about max(64 MiB, the hidden states).
    loss_chunk_tokens: Optional[int] = None
    # The attention kernel (torch's scaled_dot_product_attention backends): auto (torch picks per call), flash,
    # cudnn and efficient (CUDA; flash also on CPU), math (the reference, any device).
    attention: str = choice("auto", "auto", "flash", "cudnn", "efficient", "math")


@dataclass
class DataSourceConfig:
    """One source of a data=mix mixture: a token file or a folder of shards, drawn with `weight`."""

    path: str = MISSING
    weight: float = 1.0
    # What metrics, logs and the resume diff call it; null = the file or folder's stem.
    name: Optional[str] = None


@dataclass
class DataConfig:
    name: str = choice("stdlib", "synthetic", "memmap", "stdlib", "mix")
    path: Optional[str] = None
    # data=mix: the weighted sources (weights are normalised to sum to 1).
    sources: List[DataSourceConfig] = field(default_factory=list)
    # Token dtype of a memmap file; null = read from the FILE.json written by `llmtrain data prepare`, else uint16.
    dtype: Optional[str] = choice(None, "uint16", "uint32")
    val_fraction: float = 0.05
    # stdlib corpus size cap in bytes (one token per byte).
    max_bytes: int = 16_000_000


@dataclass
class PrecisionConfig:
    name: str = choice("fp32", "fp32", "bf16", "fp16", "fp8")
    # dtype matmuls run in (autocast / FSDP2 param_dtype); master weights and optimizer state stay fp32.
    compute_dtype: str = choice("float32", *DTYPES)
    # fp8 only: torchao's float8 scaling recipe for the transformer blocks' linear layers. tensorwise (one scale
    # per tensor) is the fastest and the one whose weights FSDP2 can all-gather in float8; rowwise (a scale per
    # row, power-of-two scales) is more accurate; rowwise_with_gw_hp also keeps the weight gradient's matmul in
    # bf16 (the most accurate).
    fp8_recipe: str = choice("tensorwise", "tensorwise", "rowwise", "rowwise_with_gw_hp")
    # dtype of gradient reduction across data-parallel ranks.
    reduce_dtype: str = choice("float32", *DTYPES)
    # Dynamic loss scaling, used by fp16 only.
    init_scale: float = 65536.0
    growth_factor: float = 2.0
    backoff_factor: float = 0.5
    growth_interval: int = 2000


@dataclass
class LoggingConfig:
    # Also write TensorBoard event files to RUN_DIR/tensorboard (needs the tensorboard extra).
    tensorboard: bool = False
    # Also log to a Weights & Biases run named run.name (needs the wandb extra; files under RUN_DIR/wandb);
    # entity null = the account's default.
    wandb: bool = False
    wandb_project: str = "llmtrain"
    wandb_entity: Optional[str] = None
    wandb_tags: List[str] = field(default_factory=list)
    # Also log to an MLflow run named run.name (needs the mlflow extra); tracking URI null = a local store,
    # RUN_DIR/mlflow.db.
    mlflow: bool = False
    mlflow_tracking_uri: Optional[str] = None
    mlflow_experiment: str = "llmtrain"
    # Seconds a tracker gets to start its run (rank 0 waits, the other ranks wait for rank 0); one that takes
    # longer is off for the launch, with a warning, and training goes on.
    tracker_start_timeout_s: float = 60


@dataclass
class ProfileConfig:
    # [A, B]: a torch.profiler trace of steps A..B (1-based) per rank into RUN_DIR/profile/; null = off.
    steps: Optional[List[int]] = None
    # Run the workers under Nsight Systems (nsys must be installed on every node).
    nsys: bool = False
    # Measure each rank's peak tensor memory over the first two steps into logs/rank{R}.status (CUDA: always; CPU:
    # only when true, through torch.profiler's allocator events, which slows those steps).
    memory: bool = False


@dataclass
class HardwareConfig:
    # auto | cpu | a GPU profile (configs/hardware/); used by `llmtrain plan`, for MFU and precision checks.
    name: str = "auto"
    # Dense peak TFLOPS per device by dtype (float32 tfloat32 bfloat16 float16 float8); empty = the GPU profile's,
    # none for a CPU (no MFU shown). A GPU profile lists every dtype its matrix units run: no bfloat16 peak = no bf16.
    peak_tflops: Dict[str, float] = field(default_factory=dict)
    # CUDA compute capability "major.minor" (e.g. "9.0"); null for AMD (gfx names are no capability) and CPU.
    compute_capability: Optional[str] = None
    memory_gib: Optional[float] = None
    intra_node_gbs: float = 450.0
    inter_node_gbs: float = 50.0
    # Share of peak the matmuls reach, for plan's step-time estimate.
    efficiency: float = 0.5


@dataclass
class RecomputeConfig:
    # none | full (whole blocks) | selective (attention core only)
    mode: str = choice("none", "none", "full", "selective")
    # Recompute every N-th block (by global layer index); 1 = all.
    every: int = 1


@dataclass
class OptimConfig:
    # AdamW kernel: auto (torch's fused=True on CUDA, the plain per-parameter loop on CPU), none (plain loop),
    # torch (fused=True; CUDA and CPU), apex (apex FusedAdam + FusedLayerNorm; needs NVIDIA apex, dp=1 tp=1).
    fused: str = choice("auto", "auto", "none", "torch", "apex")


@dataclass
class NetworkConfig:
    name: str = "none"
    # Environment variables exported to every worker (NCCL_*, GLOO_SOCKET_IFNAME, ...).
    env: Dict[str, str] = field(default_factory=dict)


@dataclass
class RunConfig:
    name: str = "${model.name}"
    dir: str = "runs/${run.name}"
    # A launch that would start a different run in a used run.dir moves the earlier one to RUN_DIR/previous/.
    overwrite: bool = False


@dataclass
class CheckpointConfig:
    # Steps between checkpoints; 0 = none by step count.
    interval: int = 0
    # Minutes of training time between checkpoints (rank 0's clock), so a crash loses at most this much work;
    # 0 = none by time. Both intervals apply; the last step's checkpoint is at_end's.
    interval_minutes: float = 30.0
    # auto (newest complete checkpoint of run.dir, else fresh) | none | PATH of a checkpoint folder
    resume: str = "auto"
    # Newest complete checkpoints kept.
    keep: int = 2
    # checkpoint.async in configs and overrides (a Python keyword, so the schema field is named async_save):
    # save in the background while training goes on; "saved" is logged once every rank's part is on disk.
    async_save: bool = False
    # Save a checkpoint after the last step.
    at_end: bool = True
    # Where checkpoints are kept: null = RUN_DIR/checkpoints; a path, or an object store's URI (s3://bucket/prefix/RUN,
    # through fsspec; credentials and endpoint from the store's own environment and config files, never from here).
    dir: Optional[str] = None
    # A fast tier: save to this folder (each node's own disk, or a scratch filesystem every node sees), and upload
    # every upload_every-th of those saves to checkpoint.dir in the background; null = save to checkpoint.dir directly.
    local_dir: Optional[str] = None
    upload_every: int = 1


@dataclass
class LaunchConfig:
    max_restarts: int = 0
    # Seconds a gloo/NCCL collective may wait before the job fails instead of hanging.
    pg_timeout_s: int = 600
    # Seconds without a completed step (on any rank, after its first) before the launcher calls the job hung,
    # gathers stacks and collective traces into RUN_DIR/hangs/, says why in one line and stops it; the bound
    # grows to 10x the median step time when steps are slower than a tenth of this.
    hang_timeout_s: float = 300.0
    # After a hang, seconds to wait for every node agent's stacks and traces; a node silent by then (its agent
    # stopped or unreachable) is named in the verdict. The agents answer within about 6 s (py-spy takes longer).
    hang_evidence_wait_s: float = 30.0
    # Threads per worker process; null = cores / processes on this node.
    omp_num_threads: Optional[int] = None
    # After SIGTERM/SIGUSR1, how long workers get to checkpoint before they are killed.
    preempt_grace_s: int = 120
    # cluster=local: seconds for the first worker to start (torchrun's rendezvous) before the launch gives up.
    rendezvous_timeout_s: int = 300
    # Refuse (instead of warn about) a launch whose planned peak memory per rank exceeds this node's memory.
    require_fit: bool = False
    # Refuse, even without require_fit, a launch whose plan needs more than this many times this node's memory
    # (it would thrash the machine or be killed); null = only warn.
    max_memory_ratio: Optional[float] = 1.5
    # Name a rank whose compute time per log interval exceeds the ranks' (lower) median by this factor; 0 = no
    # straggler detection (no timers, no per-interval all_gather).
    straggler_factor: float = 1.2
    # Consecutive slow log intervals before a rank is named a straggler.
    straggler_intervals: int = 3


@dataclass
class DoctorConfig:
    # `llmtrain doctor` results: one folder per check, DIR/<YYYYmmdd-HHMMSS>/ (report.json, logs/), apart from any
    # run directory.
    dir: str = "runs/doctor"
    # cluster=ssh: seconds ssh gets to reach each host before doctor calls it unreachable.
    connect_timeout_s: int = 10


@dataclass
class LLMTrainConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    data: DataConfig = field(default_factory=DataConfig)
    precision: PrecisionConfig = field(default_factory=PrecisionConfig)
    recompute: RecomputeConfig = field(default_factory=RecomputeConfig)
    hardware: HardwareConfig = field(default_factory=HardwareConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    profile: ProfileConfig = field(default_factory=ProfileConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    network: NetworkConfig = field(default_factory=NetworkConfig)
    run: RunConfig = field(default_factory=RunConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    launch: LaunchConfig = field(default_factory=LaunchConfig)
    doctor: DoctorConfig = field(default_factory=DoctorConfig)
    # Extra environment variables for every worker (added on top of network.env).
    env: Dict[str, str] = field(default_factory=dict)
    device: str = choice("auto", "auto", "cpu", "cuda")
