"""Every command shown in README and docs/ parses with llmtrain's own argument parser and its overrides compose; the
quick ones (config, plan, launches as dry runs) run in-process and exit as the page says; links between the pages
lead somewhere."""

from __future__ import annotations

import re
import shlex
import shutil
from pathlib import Path

import pytest
from conftest import REPO
from helpers.s3_server import fresh_clients

from llmtrain.cli import build_parser, hydra_flag_error, main

PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
# Linked from README's "Where to go next", written alongside this one: they may not be here yet.
PAGES_WRITTEN_ELSEWHERE = {"docs/launcher.md", "docs/architecture.md"}


def shown_commands() -> list[tuple[str, str]]:
    """(page, command) for each `llmtrain ...` or `python -m llmtrain ...` in a page's ```bash blocks, also after `&&`."""
    found = []
    for page in PAGES:
        for block in re.findall(r"```bash\n(.*?)```", page.read_text(), re.S):
            for line in block.replace("\\\n", " ").splitlines():  # a command continued with a backslash is one
                for part in line.split("&&"):
                    part = part.strip()
                    if part.startswith(("llmtrain ", "python -m llmtrain ")) or part in ("llmtrain", "python -m llmtrain"):
                        found.append((str(page.relative_to(REPO)), part))
    return found


COMMANDS = shown_commands()


def argv_of(command: str) -> list[str]:
    words = shlex.split(command, comments=True)
    return words[3:] if words[0] == "python" else words[1:]


def skip_reason(argv: list[str]) -> str | None:
    """Why a command that parses is not also run here (None: it runs)."""
    if argv[:1] in (["status"], ["follow"], ["cancel"], ["report"], ["compare"], ["ckpt"]):
        return "needs a run directory with a job or checkpoints: tests/integration/test_jobs.py, test_report.py, test_checkpoint.py"
    if argv[:1] in (["generate"], ["eval"]):
        return "needs a checkpoint: tests/integration/test_inference_cli.py runs both on checkpoints and run directories"
    if argv[:1] == ["doctor"]:
        return "starts a job on every node of the cluster: tests/integration/test_doctor.py"
    if argv[:1] == ["tune"]:
        return "launches a trial per layout: tests/integration/test_tune.py runs it"
    if argv[:2] == ["data", "prepare"]:
        return "tokenizes the page's own corpus: tests/unit/test_data.py and test_data_formats.py run its options"
    if any(a.startswith("model.init_from=") for a in argv):
        return "needs a Hugging Face folder: tests/integration/test_pretrained.py runs it against one shaped like Llama 3.2 1B"
    return None


@pytest.fixture(scope="module")
def stand_ins(tmp_path_factory):
    """A working directory with the files the pages' commands name: a hostfile, token files, a user config folder."""
    cwd = tmp_path_factory.mktemp("pages")
    home = cwd / "home"
    (home / "my-configs" / "model").mkdir(parents=True)
    (home / "my-configs" / "model" / "my-gpt.yaml").write_text(
        "name: my-gpt\nn_layers: 2\nn_heads: 2\nd_model: 32\nvocab_size: 256\nseq_len: 32\n")
    (cwd / "hosts.txt").write_text("node1 slots=8\nnode2 slots=8\n")
    for tuned in ("tunes/tiny", "tunes/gpt-1.3b"):  # what `llmtrain tune` writes for docs/tune.md's launch lines
        (cwd / tuned / "best" / "parallel").mkdir(parents=True)
        (cwd / tuned / "best" / "parallel" / "tuned.yaml").write_text(
            "# @package _global_\nparallel:\n  zero: 2\nrecompute:\n  mode: selective\n")
    (cwd / "corpus").mkdir()
    # Enough tokens for one validation sequence of gpt-125m (2049 tokens in the last 5%).
    (cwd / "corpus" / "a.txt").write_text("hello llmtrain\n" * 3000)
    assert main(["data", "prepare", "--input", str(cwd / "corpus"), "--output", str(cwd / "data" / "train.bin")]) == 0
    for source in ("web", "code"):  # the two sources of the data=mix example
        for suffix in ("", ".json"):
            shutil.copy(cwd / "data" / f"train.bin{suffix}", cwd / "data" / f"{source}.bin{suffix}")
    # ... and the shard folder the end-to-end example writes
    assert main(["data", "prepare", "--input", str(cwd / "corpus"), "--output", str(cwd / "data" / "web"),
                 "--shard-tokens", "20000", "--workers", "1"]) == 0
    return cwd, home


def test_the_pages_show_commands():
    pages = {page for page, _ in COMMANDS}
    assert len(COMMANDS) >= 40, len(COMMANDS)
    assert {"README.md", "docs/configs.md", "docs/multinode.md", "docs/planning.md", "docs/sweeps.md"} <= pages
    assert ("README.md", "llmtrain launch") in COMMANDS  # the set-up's first command, after `pip install ... &&`


@pytest.mark.parametrize("page,command", COMMANDS, ids=[f"{p}:{c[:60]}" for p, c in COMMANDS])
def test_shown_command_parses_composes_and_runs(page, command, stand_ins, monkeypatch, capsys, request):
    from llmtrain.config import builtin_config_dir
    from llmtrain.launch.config_probes import compose_here
    from llmtrain.sweep.expand import expand

    cwd, home = stand_ins
    monkeypatch.chdir(cwd)
    monkeypatch.setenv("HOME", str(home))
    argv = argv_of(command)
    buckets = re.findall(r"s3://([a-z0-9.-]+)/", command)
    if buckets:  # the page's store, on the tests' S3 server (its launch probes a write there)
        server = request.getfixturevalue("s3_server")
        for key, value in server.env.items():
            monkeypatch.setenv(key, value)
        fresh_clients()
        for bucket in buckets:
            server.filesystem().mkdirs(bucket, exist_ok=True)
    assert hydra_flag_error(argv) is None, command
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as e:
        pytest.fail(f"{page}: `{command}` does not parse (exit {e.code}): {capsys.readouterr().err}")
    if hasattr(args, "overrides"):
        if getattr(args, "multirun", False):
            dirs = [builtin_config_dir(), *(Path(d).expanduser() for d in args.config_dir)]
            combinations = expand(args.overrides, dirs)
            assert len(combinations) >= 2, command
            for combination in combinations:
                compose_here(combination.overrides, args.config_dir)
        else:
            compose_here(args.overrides, args.config_dir)
    reason = skip_reason(argv)
    if reason:
        pytest.skip(f"parsed and composed; not run here: {reason}")
    capsys.readouterr()
    if argv[0] == "launch":
        # The examples are for GPU nodes: a dry run on this machine would refuse their plans' memory.
        code = main(["launch", "--dry-run", *[a for a in argv[1:] if a != "--dry-run"], "launch.max_memory_ratio=null"])
        out, err = capsys.readouterr()
        assert code == 0, f"{page}: {command}: {err}"
        assert "llmtrain.worker" in out or "sweep" in out, out[-2000:]
        assert not (cwd / "runs").exists(), "a dry run wrote a run directory"
    elif argv[0] == "plan":
        code = main(argv)
        out, err = capsys.readouterr()
        assert code == 0 and "fit" in out, f"{page}: {command}: {out[-1000:]} {err}"
    elif argv[0] == "config":
        code = main(argv)
        out, err = capsys.readouterr()
        assert code == 0 and "\nmodel:\n" in f"\n{out}", f"{page}: {command}: {err}"
    else:
        pytest.fail(f"{page}: `{command}`: give it a way to run here or a reason in skip_reason")


@pytest.mark.parametrize("args", [[], ["launch"], ["config"], ["tune"], ["data"], ["data", "prepare"]])
def test_help(args, capsys):
    with pytest.raises(SystemExit) as exited:
        main([*args, "--help"])
    out = capsys.readouterr().out
    assert exited.value.code == 0 and "usage: llmtrain" in out
    if args[:1] in (["launch"], ["config"], ["tune"]):
        assert "group=option" in out and "--config-dir" in out


def test_validation_examples(capsys):
    """`$ llmtrain ...` followed by its `llmtrain: error: ...` line, on any page: the same line, exit 2."""
    examples = [m for page in PAGES
                for m in re.findall(r"^\$ (llmtrain .*)\n(llmtrain: error: [^\n]*)$", page.read_text(), re.M)]
    assert len(examples) >= 8, examples
    for command, message in examples:
        argv = shlex.split(command)[1:]
        try:
            code = main(argv)
        except SystemExit as e:  # refused by the argument parser itself
            code = e.code
        err = capsys.readouterr().err
        assert code == 2, (command, err)
        assert err.strip().startswith(message.split("...")[0]), (command, err)


def heading_anchors(page: Path) -> set[str]:
    """GitHub's anchors of a page's headings: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in re.findall(r"^#+ (.*)$", text, re.M)}


def test_links_between_pages_lead_somewhere():
    checked = 0
    for page in PAGES:
        text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if target.startswith(("http://", "https://")):
                continue
            path, _, anchor = target.partition("#")
            linked = (page.parent / path).resolve() if path else page
            name = str(linked.relative_to(REPO)) if linked.is_relative_to(REPO) else str(linked)
            if not linked.exists() and name in PAGES_WRITTEN_ELSEWHERE:
                continue
            assert linked.is_file(), f"{page.relative_to(REPO)}: link to {target}: no such file"
            if anchor:
                assert anchor in heading_anchors(linked), f"{page.relative_to(REPO)}: link to {target}: no such heading"
            checked += 1
    assert checked >= 20, checked


def test_readme_start_line_is_the_one_launch_prints():
    """The first line of README's captured `llmtrain launch` is what the launcher prints for the default config."""
    from llmtrain.config import compose_config
    from llmtrain.launch.run import start_line
    from llmtrain.parallel.layout import ParallelDims

    readme = (REPO / "README.md").read_text()
    captured = readme.split("What `llmtrain launch` shows", 1)[1].split("```\n", 2)[1]
    first = captured.splitlines()[0]
    run_dir, host = re.fullmatch(r"llmtrain: run directory (\S+); .* node\(s\) \((\S+)\), backend local", first).groups()
    cfg = compose_config([])
    assert first == start_line(run_dir, ParallelDims.from_config(cfg), cfg.cluster.nnodes, [host], "local")
