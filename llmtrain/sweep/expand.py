"""The combinations of a sweep. Hydra's own override parser reads the sweep values (`a,b,c`, `range(...)`,
`choice(...)`, `glob(...)` of a group's options); the combinations are their cartesian product in the order the
keys were given, the last key varying fastest, as in Hydra's multirun. The order is fixed, so the same command
gives the same run directories, which is what lets it resume."""

from __future__ import annotations

import hashlib
import itertools
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Sequence

from llmtrain.config.errors import ConfigError
from llmtrain.config.override_checks import quoting_error

MAX_DIR_NAME = 96  # characters of a run directory's name: its swept values, cut (and hashed) to stay short
_UNSAFE = re.compile(r"[^A-Za-z0-9._,=+@-]+")
_HASH_CHARS = 8


@dataclass(frozen=True)
class Combination:
    index: int  # its position in this command's product (the dry run's #, a Slurm job's name)
    swept: dict[str, str]  # key (without +/~) -> the value this run takes, as Hydra writes it
    overrides: tuple[str, ...]  # every override of this run: the command's, each sweep replaced by one value
    fixed: tuple[str, ...] = ()  # the command's overrides of one value: the same in every combination

    @property
    def label(self) -> str:
        return ",".join(f"{key}={value}" for key, value in self.swept.items())

    @property
    def dir_name(self) -> str:
        return run_dir_name(self.swept)


def run_dir_name(swept: dict[str, str]) -> str:
    """A run's folder in its sweep, named by its values, not its position, so that adding values to a sweep
    leaves every run where it was: the last part of each key where those stay unique (train.lr=0.001 ->
    lr=0.001), characters a path should not hold as _, and a hash of the whole combination when that changed or
    cut the name (it then still tells combinations apart)."""
    if not swept:
        return "run"
    tails = [key.rsplit(".", 1)[-1] for key in swept]
    keys = tails if len(set(tails)) == len(tails) else list(swept)
    name = ",".join(f"{key}={value}" for key, value in zip(keys, swept.values()))
    safe = _UNSAFE.sub("_", name)
    if safe == name and len(name) <= MAX_DIR_NAME:
        return name
    label = ",".join(f"{key}={value}" for key, value in swept.items())
    digest = hashlib.sha1(label.encode("utf-8")).hexdigest()[:_HASH_CHARS]
    return f"{safe[:MAX_DIR_NAME - _HASH_CHARS - 1]}-{digest}"


class GroupOptions:
    """What Hydra's glob() asks a config loader for: the options of a config group, from the config folders."""

    def __init__(self, config_dirs: Iterable[Path]):
        self.config_dirs = [Path(d) for d in config_dirs]

    def groups(self) -> set[str]:
        from llmtrain.config.compose import config_groups

        return config_groups(self.config_dirs)

    def get_group_options(self, group: str, results_filter=None, config_name=None, overrides=None) -> list[str]:
        return sorted({f.stem for d in self.config_dirs for f in (d / group).glob("*.yaml")})


def expand(overrides: Sequence[str], config_dirs: Iterable[Path]) -> list[Combination]:
    """Every combination of the swept values; ConfigError naming the key for a sweep llmtrain cannot run."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException, OverrideParseException

    options = GroupOptions(config_dirs)
    try:
        parsed = OverridesParser.create(config_loader=options).parse_overrides(list(overrides))
    except OverrideParseException as e:
        raise quoting_error(e.override, str(e).strip().splitlines()[0]) from None
    except HydraException as e:
        raise ConfigError(getattr(e, "override", None) or "override", str(e).strip().splitlines()[0]) from None
    choices: dict[str, list[tuple[str, str]]] = {}  # key as written -> [(value, override)], in the given order
    swept: set[str] = set()
    for override in parsed:
        key = override.get_key_element()
        if override.is_sweep_override():
            swept.add(key)
            choices[key] = [(value, f"{key}={value}") for value in _sweep_values(override, options)]
        else:
            swept.discard(key)  # given again with one value: the later one wins, as in Hydra
            choices[key] = [("", override.input_line)]
    combinations = []
    fixed = tuple(options_[0][1] for key, options_ in choices.items() if key not in swept)
    for index, picks in enumerate(itertools.product(*choices.values())):
        chosen = dict(zip(choices, picks))
        combinations.append(Combination(
            index=index, overrides=tuple(override for _, override in picks), fixed=fixed,
            swept={key.lstrip("+~"): value for key, (value, _) in chosen.items() if key in swept}))
    _refuse_repeats(combinations)
    return combinations


def _refuse_repeats(combinations: list[Combination]) -> None:
    """Two values that Hydra reads as one (1e-3 and 0.001) would be one run twice, in one folder."""
    seen: dict[str, Combination] = {}
    for combination in combinations:
        earlier = seen.setdefault(combination.dir_name, combination)
        if earlier is not combination:
            key = next(k for k in combination.swept if combination.swept[k] != earlier.swept[k]) \
                if combination.swept != earlier.swept else next(iter(combination.swept))
            raise ConfigError(key, f"the sweep gives the combination {combination.label} twice (runs "
                                   f"{earlier.index} and {combination.index}): list each value once")


def _sweep_values(override, options: GroupOptions) -> list[str]:
    key = override.key_or_group
    if key == "run.dir":
        raise ConfigError("run.dir", "in a sweep run.dir is the sweep directory (each run goes to "
                                     "RUN_DIR/<swept values>): give it one value")
    if not override.is_discrete_sweep():
        raise ConfigError(key, f"{override.input_line.partition('=')[2]} is a continuous range, and a sweep runs "
                               "a list of values: use a,b,c, range(start,stop[,step]) or choice(...)")
    if getattr(override.value(), "shuffle", False):
        raise ConfigError(key, "shuffle(...) gives another order each time, so the same command could not resume "
                               "the sweep: list the values in one order")
    if override.value_type.name == "GLOB_CHOICE_SWEEP" and key not in options.groups():
        raise ConfigError(key, f"glob(...) picks options of a config group ({', '.join(sorted(options.groups()))})"
                               f", and {key} is not one")
    values = list(override.sweep_string_iterator())
    if not values:
        raise ConfigError(key, f"the sweep {override.input_line.partition('=')[2]} gives no value")
    return values
