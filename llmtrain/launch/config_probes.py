"""The launcher's checks of a config against this machine: files on disk (token files, sources, init_from, the
hostfile), installed extras (torchao, apex, TensorBoard, trackers), nsys on PATH, the container, and whether the
device runs fp8. config.validate holds the rules between keys; each probe here runs right after the section of
rules it is keyed by, so every command reports the same first failure with the same words as before the split.

`compose_here` and `validate_here` are what every command that checks a config before anything starts calls
(launch, --dry-run, config, plan, doctor, sweeps, and the worker on its frozen config)."""

from __future__ import annotations

import importlib.util
import os
import shutil
from typing import Iterable, Sequence

from omegaconf import DictConfig

from llmtrain.config import compose_config, validate
from llmtrain.config.errors import ConfigError
from llmtrain.launch.backends.traits import traits_of

APEX_EXTENSIONS = ("amp_C", "fused_layer_norm_cuda")  # FusedAdam's and FusedLayerNorm's kernels
APEX_BUILD = ("git clone https://github.com/NVIDIA/apex && cd apex && APEX_CUDA_EXT=1 pip install -v "
              "--no-build-isolation . (docs/parallelism.md, 'Fused AdamW and NVIDIA apex': a build of just these "
              "two); or use optim.fused=auto (torch's fused AdamW on CUDA, no build)")
APEX_INSTALL = ("NVIDIA apex is not installed (it is not on PyPI); optim.fused=apex needs its CUDA extensions "
                f"{' and '.join(APEX_EXTENSIONS)}: {APEX_BUILD}")
LIGER_INSTALL = ("liger needs Liger-Kernel, which is not installed: pip install 'llmtrain[liger]' (in a checkout: "
                 "pip install -e '.[liger]'); or use train.loss=chunked")
FP8_INSTALL = ("fp8 needs torchao (its float8 training), which is not installed: pip install 'llmtrain[fp8]' "
               "(in a checkout: pip install -e '.[fp8]')")


def _require(ok: bool, key: str, message: str | None) -> None:
    if not ok:
        raise ConfigError(key, message)


def apex_missing() -> str | None:
    """Why optim.fused=apex cannot run here, or None. Looked up without importing (apex imports torch)."""
    if importlib.util.find_spec("apex") is None:
        return APEX_INSTALL
    missing = [name for name in APEX_EXTENSIONS if importlib.util.find_spec(name) is None]
    if missing:
        return (f"NVIDIA apex is installed without its CUDA extension(s) {' and '.join(missing)} (a Python-only "
                f"build); rebuild it: {APEX_BUILD}")
    return None


def torchao_missing() -> str | None:
    """Why torchao cannot be used, or None. Looked up without importing it (it imports torch)."""
    return FP8_INSTALL if importlib.util.find_spec("torchao") is None else None


def fp8_problem(cfg) -> str | None:
    """The first reason precision=fp8 cannot run with this config here: device, then shapes, then torchao."""
    from llmtrain.config.fp8 import shape_problem
    from llmtrain.hardware.fp8_device import configured_device_problem

    return configured_device_problem(cfg) or shape_problem(cfg) or torchao_missing()


def _cluster(cfg: DictConfig) -> None:
    from llmtrain.launch.container import check_container
    from llmtrain.launch.hostfile import cluster_hosts

    if traits_of(cfg.cluster.name).uses_hostfile:
        cluster_hosts(cfg.cluster)
    check_container(cfg)


def _model(cfg: DictConfig) -> None:
    m = cfg.model
    if not m.init_from:
        return
    from llmtrain.checkpoint.storage import is_uri

    if is_uri(m.init_from):
        # Only whether its store's client is installed (no network here); what the URI holds is read, from its
        # files' headers, before the workers start (launch.run.check_init_from).
        from llmtrain.checkpoint.storage.probe import install_problem

        problem = install_problem(m.init_from)
        _require(problem is None, "model.init_from", f"{m.init_from}: {problem}")
        return
    _require(os.path.exists(os.path.expanduser(m.init_from)), "model.init_from", f"no such file or folder: "
                                                                               f"{m.init_from}")


def _data_then_fp8_device(cfg: DictConfig) -> None:
    """For a token file everything knowable without reading it whole (os + json only: no torch here, the launcher
    starts fast): vocabulary, dtype, size, and room for one sample per split. Then fp8's device, which has always
    been asked before its shape rule."""
    from llmtrain.data.errors import DataError
    from llmtrain.data.token_source import check_token_source
    from llmtrain.data.tokenfile import check_split_sizes

    d, t, m = cfg.data, cfg.train, cfg.model
    need_val = bool(t.eval_interval and t.eval_steps)  # the trainer evaluates only then
    try:
        if d.name == "memmap":
            # A token file, or a folder of shards (`data prepare --shard-tokens`) read as their concatenation.
            _require(os.path.exists(os.path.expanduser(str(d.path))), "data.path", f"no such file: {d.path}")
            check_token_source(str(d.path), dtype=d.dtype, seq_len=m.seq_len, val_fraction=d.val_fraction,
                               model_vocab=m.vocab_size, need_val=need_val)
        if d.name == "stdlib":
            # Built right before the workers start, with at most data.max_bytes tokens: too few is knowable now.
            check_split_sizes(f"the stdlib corpus (data.max_bytes={d.max_bytes})", d.max_bytes, m.seq_len,
                              d.val_fraction, need_val, key="data.max_bytes", more="raise data.max_bytes")
    except DataError as e:
        raise ConfigError(e.key, e.message) from None
    if d.name == "mix":
        from llmtrain.data.mixture_checks import check_mixture

        check_mixture(cfg)
    if cfg.precision.name == "fp8":
        from llmtrain.hardware.fp8_device import configured_device_problem

        problem = configured_device_problem(cfg)
        _require(problem is None, "precision", problem)


def _precision(cfg: DictConfig) -> None:
    if cfg.precision.name == "fp8":
        missing = torchao_missing()
        _require(missing is None, "precision", missing)


def _train(cfg: DictConfig) -> None:
    import llmtrain.loss as loss_lib  # torch-free: the choice, not the kernels

    if cfg.train.loss == loss_lib.LIGER and not loss_lib.liger_installed():
        _require(False, "train.loss", LIGER_INSTALL)


def _optim(cfg: DictConfig) -> None:
    if cfg.optim.fused == "apex":
        missing = apex_missing()
        _require(missing is None, "optim.fused", missing)


def _profile(cfg: DictConfig) -> None:
    if cfg.profile.nsys:
        _require(shutil.which("nsys") is not None, "profile.nsys",
                 "nsys (Nsight Systems) is not on PATH; install it from NVIDIA or set profile.nsys=false")


def _logging(cfg: DictConfig) -> None:
    from llmtrain.train.trackers.requirements import PACKAGES, tracker_missing
    from llmtrain.train.trackers.tensorboard import tensorboard_missing

    if cfg.logging.tensorboard:
        missing = tensorboard_missing()
        _require(missing is None, "logging.tensorboard", missing)
    for key in PACKAGES:
        if cfg.logging[key.split(".")[1]]:
            missing = tracker_missing(key)
            _require(missing is None, key, missing)


# Keyed by the section of config.validate's rules each runs after.
PROBES = {"cluster": _cluster, "model": _model, "train": _train, "data": _data_then_fp8_device, "precision": _precision,
          "optim": _optim, "profile": _profile, "logging": _logging}


def validate_here(cfg: DictConfig) -> None:
    """The config's rules and this machine's answers to what it asks for: ConfigError for the first one broken."""
    validate(cfg, PROBES)


def slots_per_node(cluster: DictConfig) -> int:
    from llmtrain.launch.hostfile import slots_per_node as hostfile_slots

    return hostfile_slots(cluster)


def compose_here(overrides: Sequence[str] = (), config_dirs: Iterable[str] = (),
                 origins: dict[str, str] | None = None) -> DictConfig:
    """compose_config with cluster.nproc_per_node=null read from the hostfile's slots, and a null
    train.global_batch_size kept from the checkpoint run.dir resumes from (launch/resumed_batch.py). `origins`,
    when given, gets where the global batch came from (config/batch.py's ORIGIN_WORDS)."""
    from llmtrain.launch.resumed_batch import checkpoint_global_batch, keep_checkpoint_batch

    found: dict[str, str] = {}
    cfg = compose_config(overrides, config_dirs, slots_per_node, found)
    keep_checkpoint_batch(cfg, found, checkpoint_global_batch(cfg))
    if origins is not None:
        origins.update(found)
    return cfg
