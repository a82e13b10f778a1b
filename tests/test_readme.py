"""The README's commands run as written: help texts, override examples (as dry runs), validation examples."""

from __future__ import annotations

import re
import shlex
import shutil

import pytest
from conftest import REPO, run_cli

README = (REPO / "README.md").read_text()


def readme_commands(prefix: str) -> list[str]:
    blocks = re.findall(r"```bash\n(.*?)```", README, re.S)
    lines = [ln.split("#")[0].strip() for block in blocks for ln in block.splitlines()]
    return [ln for ln in lines if ln.startswith(prefix)]


@pytest.mark.parametrize("args", [[], ["launch"], ["config"], ["data"], ["data", "prepare"]])
def test_help(args):
    result = run_cli([*args, "--help"])
    assert result.returncode == 0 and "usage: llmtrain" in result.stdout
    if args[:1] in (["launch"], ["config"]):
        assert "group=option" in result.stdout and "--config-dir" in result.stdout


def test_readme_override_examples_resolve(tmp_path):
    home = tmp_path / "home"
    (home / "my-configs" / "model").mkdir(parents=True)
    (home / "my-configs" / "model" / "my-gpt.yaml").write_text(
        "name: my-gpt\nn_layers: 2\nn_heads: 2\nd_model: 32\nvocab_size: 256\nseq_len: 32\n")
    (tmp_path / "hosts.txt").write_text("node1 slots=8\nnode2 slots=8\n")
    (tmp_path / "docs").mkdir()
    # Enough tokens for one validation sequence of gpt-125m (2049 tokens in the last 5%).
    (tmp_path / "docs" / "a.txt").write_text("hello llmtrain\n" * 3000)
    prepared = run_cli(["data", "prepare", "--input", "docs", "--output", "data/train.bin"], cwd=tmp_path)
    assert prepared.returncode == 0, prepared.stderr
    for source in ("web", "code"):  # the two sources of the data=mix example
        for suffix in ("", ".json"):
            shutil.copy(tmp_path / "data" / f"train.bin{suffix}", tmp_path / "data" / f"{source}.bin{suffix}")
    commands = readme_commands("llmtrain launch ")
    assert len(commands) >= 5
    for command in commands:
        if "model.init_from=" in command:
            continue  # needs a Hugging Face folder: test_pretrained.py runs it against one
        args = [a.replace("~/", f"{home}/") for a in shlex.split(command)[1:] if a != "--dry-run"]
        # The examples are for GPU nodes: a dry run on this machine would refuse their plans' memory.
        args.append("launch.max_memory_ratio=null")
        result = run_cli([args[0], "--dry-run", *args[1:]], cwd=tmp_path, env={"HOME": str(home)})
        assert result.returncode == 0, f"{command}: {result.stderr}"
        assert "llmtrain.worker" in result.stdout
        assert not (tmp_path / "runs").exists()


def test_readme_plan_examples_run():
    commands = readme_commands("llmtrain plan ")
    assert len(commands) >= 2
    for command in commands:
        result = run_cli(shlex.split(command)[1:])
        assert result.returncode == 0, f"{command}: {result.stdout[-1000:]} {result.stderr}"
        assert "fits" in result.stdout or "fit" in result.stdout


def test_readme_validation_examples():
    examples = re.findall(r"^\$ (llmtrain .*)\n(llmtrain: error: [^\n]*)$", README, re.M)
    assert len(examples) >= 3
    for command, message in examples:
        result = run_cli(shlex.split(command)[1:])
        assert result.returncode == 2
        expected = message.split("...")[0]
        assert result.stderr.strip().startswith(expected), (command, result.stderr)


def test_readme_start_line_is_the_one_launch_prints():
    """The first line of README's captured `llmtrain launch` is what the launcher prints for the default config."""
    from llmtrain.config import compose_config
    from llmtrain.launch.run import start_line
    from llmtrain.parallel.layout import ParallelDims

    captured = README.split("What `llmtrain launch` shows", 1)[1].split("```\n", 2)[1]
    first = captured.splitlines()[0]
    run_dir, host = re.fullmatch(r"llmtrain: run directory (\S+); .* node\(s\) \((\S+)\), backend local", first).groups()
    cfg = compose_config([])
    assert first == start_line(run_dir, ParallelDims.from_config(cfg), cfg.cluster.nnodes, [host], "local")
