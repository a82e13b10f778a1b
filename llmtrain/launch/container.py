"""cluster.container: each node's process in a container image, under Slurm (pyxis or apptainer) or over ssh
(apptainer).

pyxis: srun itself starts the task in the image, so the batch script's srun line gets --container-image,
--container-mounts and --container-workdir. apptainer: the node's command is wrapped in `apptainer exec`, inside
srun or inside the ssh remote command.

Both runtimes pass the host environment into the container, but a variable the image also sets keeps the image's
value (pyxis without --container-env, apptainer without --env). So the command inside runs under `env NAME=VALUE...`
with the config's variables (network preset, env:, PYTHONPATH), which win as they do without a container.
cluster.setup lines run inside the container, before the node agent: pyxis leaves no place outside it, since srun
starts the command in the image. The working directory, the run directory and the data file's folder are mounted
at their own paths, so the nodes read the config and data and write logs and checkpoints where the launcher has
them.
"""

from __future__ import annotations

import os
import sys

from omegaconf import OmegaConf

from llmtrain.config.errors import ConfigError
from llmtrain.launch.backends.base import CONTAINER_PYTHON, node_python
from llmtrain.launch.backends.traits import TRAITS, traits_of
from llmtrain.launch.node.setup import setup_statements


def backends_for(runtime: str) -> list[str]:
    """The backends whose traits list `runtime` among their container_runtimes, by name in alphabetical order."""
    return sorted(t.name for t in TRAITS.values() if runtime in t.container_runtimes)


def uses_container(cfg) -> bool:
    return cfg.cluster.container.runtime != "none"


def own_paths(cfg, workdir: str, run_dir: str) -> dict[str, str]:
    """The folders mounted at their own paths, by the key that sets each: where the job runs, the run directory
    (config, logs, checkpoints) and the data file's folder (where the launcher prepared it), or each source's."""
    paths = {"cluster.workdir": workdir, "run.dir": run_dir}
    if cfg.data.name in ("stdlib", "memmap") and cfg.data.path:
        paths["data.path"] = os.path.dirname(os.path.abspath(os.path.expanduser(cfg.data.path)))
    sources = [] if cfg.data.name != "mix" or OmegaConf.is_missing(cfg.data, "sources") else cfg.data.sources
    for i, source in enumerate(sources):  # a token file's folder, or the shard folder itself
        if not OmegaConf.is_missing(source, "path"):
            path = os.path.abspath(os.path.expanduser(str(source.path)))
            paths[f"data.sources[{i}].path"] = path if os.path.isdir(path) else os.path.dirname(path)
    return paths


def mounts(cfg, workdir: str, run_dir: str) -> list[str]:
    """`SRC:DST[:FLAGS]`: own_paths at their own paths, unless a mount already covers them, then
    cluster.container.mounts (after: a mount inside a directory must come after the directory's own)."""
    own: list[str] = []
    for path in own_paths(cfg, workdir, run_dir).values():
        targets = [m.split(":")[1] for m in [*own, *cfg.cluster.container.mounts]]
        if not any(path == t or path.startswith(t.rstrip("/") + "/") for t in targets):
            own.append(f"{path}:{path}")
    return own + list(cfg.cluster.container.mounts)


def container_workdir(cfg, workdir: str) -> str:
    return cfg.cluster.container.workdir or workdir


def srun_options(cfg, workdir: str, run_dir: str) -> list[str]:
    """pyxis: the srun options that start each node's task in the image; none for the other runtimes."""
    c = cfg.cluster.container
    if c.runtime != "pyxis":
        return []
    return [f"--container-image={c.image}", f"--container-mounts={','.join(mounts(cfg, workdir, run_dir))}",
            f"--container-workdir={container_workdir(cfg, workdir)}", *c.extra_args]


def apptainer_exec(cfg, workdir: str, run_dir: str) -> list[str]:
    c = cfg.cluster.container
    gpus = [] if cfg.device == "cpu" else ["--nv"]  # --nv binds the host's NVIDIA driver and devices
    return [c.executable, "exec", *gpus, "--bind", ",".join(mounts(cfg, workdir, run_dir)),
            "--pwd", container_workdir(cfg, workdir), *c.extra_args, c.image]


def in_container(cfg, argv: list[str], env: dict[str, str], workdir: str, run_dir: str) -> list[str]:
    """The node's command as it runs in the container: the cluster.setup lines, then argv under the config's
    environment, behind `apptainer exec` for that runtime. argv itself without a container."""
    runtime = cfg.cluster.container.runtime
    if runtime == "none":
        return argv
    command = ["env", *(f"{k}={v}" for k, v in sorted(env.items())), *argv]
    if cfg.cluster.setup:
        # The lines run in the container's shell; argv follows as "$@", so the job's shell still expands what
        # srun's arguments hold (${head}, ${port}).
        script = "; ".join([*setup_statements(cfg.cluster.setup), 'exec "$@"'])
        command = ["sh", "-c", script, "llmtrain-setup", *command]
    if runtime == "apptainer":
        command = apptainer_exec(cfg, workdir, run_dir) + command
    return command


def default_python_note(cfg) -> str | None:
    """What --dry-run says when a container runs without cluster.python: the image's own `python` runs."""
    if not uses_container(cfg) or cfg.cluster.python:
        return None
    return (f"cluster.python is not set: each node runs the image's {CONTAINER_PYTHON} (found on its PATH); set "
            "cluster.python to run another interpreter in the image")


def setup_outside(cfg) -> list[str]:
    """The cluster.setup lines the host runs before the node's command: all of them without a container, none with
    one (they run inside it, see in_container)."""
    return [] if uses_container(cfg) else list(cfg.cluster.setup)


def host_python(cfg) -> str:
    """The interpreter for what runs outside the container (the end of the Slurm batch script): with a container,
    cluster.python is the image's, so the launcher's own interpreter, as without cluster.python."""
    return sys.executable if uses_container(cfg) else node_python(cfg)


def check_container(cfg) -> None:
    """cluster.container's rules, before anything is submitted; raises ConfigError naming the key."""
    c, name = cfg.cluster.container, cfg.cluster.name
    if c.runtime == "none":
        _require(not c.image, "cluster.container.image",
                 f"is set ({c.image}) but cluster.container.runtime is none: choose pyxis or apptainer")
        return
    _require(c.runtime in traits_of(name).container_runtimes, "cluster.container.runtime",
             f"{c.runtime} works with cluster={' or cluster='.join(backends_for(c.runtime))}, not cluster={name}"
             + (" (it is a Slurm plugin: srun starts the container)" if c.runtime == "pyxis" else ""))
    _check_image(c)
    _require(bool(c.executable), "cluster.container.executable", "must name the apptainer (or singularity) command")
    for number, mount in enumerate(c.mounts, 1):
        _check_mount(number, mount)
    if c.workdir:
        _require(os.path.isabs(c.workdir), "cluster.container.workdir", f"must be an absolute path (got {c.workdir})")
    for key, path in own_paths(cfg, cfg.cluster.workdir or os.getcwd(), os.path.abspath(cfg.run.dir)).items():
        _require("," not in path and ":" not in path, key,
                 f"{path} is mounted into the container, and a mounted path cannot hold ',' or ':'")


def _check_image(c) -> None:
    examples = {"pyxis": "an enroot URI such as nvcr.io#nvidia/pytorch:24.05-py3, or an absolute path to a .sqsh file",
                "apptainer": "a .sif file or a docker:// URI"}
    _require(bool(c.image) and c.image != "???", "cluster.container.image",
             f"cluster.container.runtime={c.runtime} needs an image: {examples[c.runtime]}")
    _require(not any(ch.isspace() for ch in c.image), "cluster.container.image", f"holds a space: {c.image!r}")
    if c.runtime == "pyxis" and c.image.endswith((".sqsh", ".squashfs")):
        # pyxis reads any other value as a registry image name.
        _require(os.path.isabs(c.image), "cluster.container.image",
                 f"a squashfs image must be an absolute path (got {c.image})")


def _check_mount(number: int, mount: str) -> None:
    parts = mount.split(":")
    ok = 2 <= len(parts) <= 3 and all(os.path.isabs(p) for p in parts[:2]) and "," not in mount
    _require(ok, "cluster.container.mounts",
             f"entry {number} ({mount}) must be SRC:DST or SRC:DST:FLAGS with absolute paths and no ','")


def _require(ok: bool, key: str, message: str) -> None:
    if not ok:
        raise ConfigError(key, message)
