"""Compose the layered Hydra configs with command-line overrides into one typed, resolved, validated config."""

from __future__ import annotations

import dataclasses
import functools
import os
import typing
import warnings
from pathlib import Path
from typing import Callable, Iterable, Sequence

from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from llmtrain.config import batch
from llmtrain.config.derived import world_size
from llmtrain.config.errors import ConfigError
from llmtrain.config.key_origin import unknown_key_error
from llmtrain.config.override_checks import check_deletions, quoting_error
from llmtrain.config.schema import DataSourceConfig, LLMTrainConfig, ModelConfig
from llmtrain.launch.backends.traits import known_traits

PRIMARY_CONFIG = "config"


def builtin_config_dir() -> Path:
    """configs/ of a source checkout (editable install), else the copy shipped inside the package."""
    repo_configs = Path(__file__).resolve().parents[2] / "configs"
    if (repo_configs / f"{PRIMARY_CONFIG}.yaml").is_file():
        return repo_configs
    import llmtrain.configs  # packaged copy (pyproject maps configs/ to llmtrain.configs)

    return Path(llmtrain.configs.__file__).parent


def compose_config(overrides: Sequence[str] = (), config_dirs: Iterable[str] = (),
                   slots_per_node: Callable[[DictConfig], int] | None = None,
                   origins: dict[str, str] | None = None) -> DictConfig:
    """Return the resolved config for `overrides` (Hydra grammar). Raises ConfigError on any bad input. `origins`,
    when given, is filled with where the keys that null fills came from (config/batch.py's origins)."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    dirs = []
    for d in config_dirs:
        path = Path(d).expanduser().resolve()
        if not path.is_dir():
            raise ConfigError("--config-dir", f"no such directory: {d}")
        dirs.append(path)
    groups = config_groups([builtin_config_dir(), *dirs])
    check_override_habits(overrides, groups)
    check_deletions(overrides, groups)
    hydra_overrides = list(overrides)

    GlobalHydra.instance().clear()
    _store_schema_defaults()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with initialize_config_dir(config_dir=str(builtin_config_dir()), version_base="1.3"):
                # User folders go in front of the built-in one so their options shadow built-in ones of the
                # same name (hydra.searchpath would only append them behind it).
                loader = GlobalHydra.instance().config_loader()
                search_path = loader.get_search_path()
                for d in reversed(dirs):
                    search_path.prepend("llmtrain-user", f"file://{d}")
                if dirs:
                    loader.repository.initialize_sources(search_path)
                raw = compose(PRIMARY_CONFIG, overrides=hydra_overrides, return_hydra_config=True)
    except Exception as e:  # Hydra raises several types; all become one line naming the override
        raise _explained(_hydra_error(e, overrides), overrides, {}, dirs) from None
    finally:
        GlobalHydra.instance().clear()
    choices = OmegaConf.to_container(raw.hydra.runtime.choices)  # the option each group was given
    raw = OmegaConf.masked_copy(raw, [k for k in raw if k != "hydra"])
    if origins is not None:
        origins.update(batch.origins(raw, overrides))
    try:
        return to_typed(raw, slots_per_node)
    except ConfigError as e:
        raise _explained(e, overrides, choices, dirs) from None


def _explained(e: ConfigError, overrides: Sequence[str], choices: dict, dirs: list[Path]) -> ConfigError:
    """An unknown key names the file that holds it, if not an override, and the schema key it likely meant."""
    if e.message.startswith("unknown key (not in the"):
        return unknown_key_error(e.key, overrides, choices, [*dirs, builtin_config_dir()], PRIMARY_CONFIG)
    return e


SCHEMA_NODE = "llmtrain_schema"


@functools.cache
def _store_schema_defaults() -> None:
    """The schema's defaults as the first entry of config.yaml's defaults list: every key exists (and can be
    overridden) without the YAML files repeating them. Stored as plain values with the config's own key names
    (checkpoint.async); types are checked when the composed config is merged onto the schema (to_typed). Once
    per process: Hydra's ConfigStore outlives each composition."""
    from hydra.core.config_store import ConfigStore

    node = OmegaConf.to_container(OmegaConf.structured(LLMTrainConfig), resolve=False)
    for (section, key), field_name in _KEYWORD_KEYS.items():
        node[section][key] = node[section].pop(field_name)
    ConfigStore.instance().store(name=SCHEMA_NODE, node=node)


def config_groups(config_dirs: Iterable[Path]) -> set[str]:
    """The config groups: the sub-folders of the config folders."""
    return {p.name for d in config_dirs for p in Path(d).iterdir() if p.is_dir() and not p.name.startswith(("_", "."))}


def check_override_habits(overrides: Sequence[str], groups: set[str]) -> None:
    """Hydra-app habits that mean something else here: one line saying what llmtrain wants instead."""
    for override in overrides:
        key, eq, value = override.partition("=")
        bare = key.lstrip("+~")
        if bare == "hydra" or bare.startswith("hydra."):
            hint = f"run.dir={value}" if bare in ("hydra.run.dir", "hydra.sweep.dir") and eq else "run.dir=DIR"
            raise ConfigError(bare, "llmtrain does not use Hydra's own settings: the run directory is run.dir "
                                    f"({hint}), logs go to RUN_DIR/logs")
        if key.startswith("+") and bare in groups and eq:
            raise ConfigError(bare, f"'{bare}' is a config group that always has an option; choose it with "
                                    f"{bare}={value} (no '+')")
        if eq and _is_sweep(override):
            raise ConfigError(bare, f"'{value}' is several values (a sweep), and llmtrain launch runs one "
                                    f"configuration: give one value (a value holding a comma is quoted: "
                                    f"{bare}='\"a,b\"'), or use -m to sweep (llmtrain launch -m ...)")


def _is_sweep(override: str) -> bool:
    """Whether Hydra's multirun reads `override` as several values (a comma list, range, choice, glob, interval).
    One Hydra cannot parse is not a sweep here: composing it names the key with Hydra's own message."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    try:
        return OverridesParser.create().parse_override(override).is_sweep_override()
    except HydraException:
        return False


# Config keys that are Python keywords cannot be dataclass fields: the schema holds them under another name.
_KEYWORD_KEYS = {("checkpoint", "async"): "async_save"}


@functools.cache
def _schema() -> DictConfig:
    """LLMTrainConfig as a structured config, built once (building it from the dataclasses is a third of a
    composition's time)."""
    return OmegaConf.structured(LLMTrainConfig)


def to_typed(raw: DictConfig, slots_per_node: Callable[[DictConfig], int] | None = None) -> DictConfig:
    """Merge onto the schema (unknown keys, wrong types) and resolve interpolations. The result stays typed (a
    structured config of LLMTrainConfig): assigning a wrong type or an unknown key later fails too."""
    raw = OmegaConf.create(OmegaConf.to_container(raw, resolve=False))
    for (section, key), field_name in _KEYWORD_KEYS.items():
        if section in raw and isinstance(raw[section], DictConfig) and key in raw[section]:
            raw[section][field_name] = raw[section].pop(key)
    try:
        typed = OmegaConf.merge(_schema(), raw)  # merge copies the schema: the cached one stays as it is
        OmegaConf.resolve(typed)
    except OmegaConfBaseException as e:
        raise _omegaconf_error(e, raw) from None
    _fill_defaults(typed, slots_per_node)
    return typed


def _fill_defaults(cfg: DictConfig, slots_per_node) -> None:
    if cfg.cluster.nproc_per_node is None:
        cfg.cluster.nproc_per_node = _nproc_from_hostfile(cfg.cluster, slots_per_node)
    world = world_size(cfg)
    p = cfg.parallel
    cp = p.get("cp", 1)
    if p.dp is None and p.tp > 0 and p.pp > 0 and cp > 0 and world % (p.tp * p.pp * cp) == 0:
        p.dp = world // (p.tp * p.pp * cp)
    batch.fill(cfg, fill_micro=False)  # the global batch never follows the layout; the micro-batch may


def _nproc_from_hostfile(cluster: DictConfig, slots_per_node) -> int:
    """cluster.nproc_per_node=null (cluster=ssh's default): the hostfile's slots per host. Resolved here, before
    the world size is derived and validated, so the rest of llmtrain always sees a number; the launcher passes
    the reader of its hostfile (`slots_per_node`)."""
    traits = known_traits(cluster.name)  # composed, not yet validated: the name may be unknown
    if traits is None or not traits.uses_hostfile:
        raise ConfigError("cluster.nproc_per_node", "null (the hostfile's slots) needs cluster=ssh; give a number")
    if OmegaConf.is_missing(cluster, "hostfile") or not cluster.hostfile:
        raise ConfigError("cluster.hostfile", "cluster=ssh needs a hostfile: cluster.hostfile=FILE (lines of "
                                              "'hostname slots=N')")
    if slots_per_node is None:
        raise ConfigError("cluster.nproc_per_node", "null (the hostfile's slots) is read by the launcher; "
                                                    "compose through llmtrain.launch.config_probes or give a number")
    return slots_per_node(cluster)


def load_run_config(path: str | os.PathLike) -> DictConfig:
    """The frozen config.yaml of a run directory, typed again (workers and resume read it)."""
    try:
        raw = OmegaConf.load(path)
    except FileNotFoundError:
        raise ConfigError("run.dir", f"no config.yaml at {path}") from None
    except Exception as e:
        raise ConfigError(str(path), f"unreadable config: {_first_line(str(e))}") from None
    return to_typed(raw)


def to_plain(cfg: DictConfig) -> dict:
    """The config as a dict with the keys users write (checkpoint.async, not the schema's async_save)."""
    plain = OmegaConf.to_container(cfg)
    for (section, key), field_name in _KEYWORD_KEYS.items():
        if field_name in plain.get(section, {}):
            plain[section][key] = plain[section].pop(field_name)
    return plain


def flat_keys(plain: dict, prefix: str = "") -> dict[str, object]:
    """{dotted key: value} of a plain config dict; an empty mapping is a value of its own."""
    flat: dict[str, object] = {}
    for key, value in plain.items():
        if isinstance(value, dict) and value:
            flat.update(flat_keys(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def to_yaml(cfg: DictConfig) -> str:
    return OmegaConf.to_yaml(to_plain(cfg))


def _first_line(text: str) -> str:
    return text.strip().splitlines()[0] if text.strip() else text


# Optional sections: null until set whole, so their fields cannot be overridden one by one before that.
def _optional_sections() -> dict[str, set[str]]:
    """{"model.NAME": its fields} for each model section that defaults to null (rope scaling, experts)."""
    hints = typing.get_type_hints(ModelConfig)
    sections = {}
    for f in dataclasses.fields(ModelConfig):
        inner = [t for t in typing.get_args(hints[f.name]) if dataclasses.is_dataclass(t)]
        if f.default is None and inner:
            sections[f"model.{f.name}"] = {g.name for g in dataclasses.fields(inner[0])}
    return sections


_OPTIONAL_SECTIONS = _optional_sections()


def _omegaconf_error(e: OmegaConfBaseException, raw: DictConfig | None = None) -> ConfigError:
    key = getattr(e, "full_key", None) or "config"
    if "." not in key and getattr(e, "object_type", None) is DataSourceConfig:
        key = _source_key(key, raw)
    msg = _first_line(getattr(e, "msg", None) or str(e))
    if "not in struct" in msg or "Key '" in msg and "not in" in msg:
        msg = "unknown key (not in the schema; check its spelling)"
        if key.startswith("env."):
            msg = f"not set yet: add a new variable with +{key}=VALUE (with '+')"
        elif key.rpartition(".")[2] in _OPTIONAL_SECTIONS.get(key.rpartition(".")[0], ()):
            # A known field of an optional section that is null until set whole.
            section, _, field_name = key.rpartition(".")
            msg = (f"{section} is null here; set the section whole: {section}={{{field_name}:...}} "
                   "(its other fields take their defaults)")
    elif "is not a subclass of DataSourceConfig" in msg:
        msg = "each source is a mapping {path: FILE_OR_FOLDER, weight: W, name: NAME} (weight and name optional)"
    elif "could not be converted" in msg or "Invalid value" in msg or "Incompatible value" in msg:
        msg = f"wrong type: {msg}"
    return ConfigError(key, msg)


def _source_key(field_name: str, raw: DictConfig | None) -> str:
    """OmegaConf names a bad key inside a list element without the list: `data.sources[I].KEY` says which."""
    sources = OmegaConf.select(raw, "data.sources", default=None) if raw is not None else None
    for i, source in enumerate(sources if isinstance(sources, ListConfig) else []):
        if isinstance(source, DictConfig) and field_name in source:
            return f"data.sources[{i}].{field_name}"
    return f"data.sources[].{field_name}"


def _hydra_error(e: Exception, overrides: Sequence[str]) -> ConfigError:
    from hydra.errors import MissingConfigException, OverrideParseException

    text = str(e)
    if isinstance(e, MissingConfigException):
        group, _, option = (e.missing_cfg_file or "").rpartition("/")
        if not group:
            return ConfigError("config", _first_line(text))
        from llmtrain.config.validate import RETIRED_OPTIONS

        if option in RETIRED_OPTIONS.get(group, {}):
            return ConfigError(group, f"{option} is retired: {RETIRED_OPTIONS[group][option]}")
        options = list(e.options or ())
        avail = f" (available: {', '.join(options)})" if options else ""
        return ConfigError(group, f"no config option '{option}' in group '{group}'{avail}")
    if isinstance(e, OverrideParseException):
        return quoting_error(e.override, _first_line(text))
    peak = _first_line(text).split("'")
    if peak[0] == "Could not override " and peak[1].startswith("hardware.peak_tflops."):  # a CPU's table is empty
        return ConfigError(peak[1], f"not in this profile's peak table: add it with +{peak[1]}=<TFLOPS> (with '+')")
    cause = e.__cause__ or e.__context__
    if isinstance(cause, OmegaConfBaseException):
        return _omegaconf_error(cause)
    first = _first_line(text)
    if first.startswith("Could not override '"):
        key = first.split("'")[1]
        return ConfigError(key, f"unknown key (not in the config; use +{key}=... only for keys that may be added)")
    if first.startswith("Could not append to config. An item is already at '"):
        key = first.split("'")[1]
        return ConfigError(key, "already set; override it without '+'")
    if first.startswith("Could not delete from config. "):
        key = first.split("'")[1] if "'" in first else "override"
        return ConfigError(key, "cannot delete: no such key")
    return ConfigError("override", first)
