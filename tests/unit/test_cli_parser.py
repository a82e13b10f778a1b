"""The command line's parser: options anywhere among a command's overrides and other positionals, and the one-line
refusal of an unknown option."""

from __future__ import annotations

import argparse

import pytest

from llmtrain.cli import build_parser

# argv -> the values it must parse to; each has an option after a positional.
CASES = {
    "launch": (["launch", "model=gpt-tiny", "--dry-run", "train.max_steps=5"],
               {"overrides": ["model=gpt-tiny", "train.max_steps=5"], "dry_run": True}),
    "launch -m": (["launch", "-m", "train.lr=1e-3,2e-3", "--fail-fast", "run.dir=s", "--config-dir", "c", "x=1"],
                  {"overrides": ["train.lr=1e-3,2e-3", "run.dir=s", "x=1"], "multirun": True, "fail_fast": True,
                   "config_dir": ["c"]}),
    "config": (["config", "train.max_steps=5", "--config-dir", "mine", "run.name=x"],
               {"overrides": ["train.max_steps=5", "run.name=x"], "config_dir": ["mine"]}),
    "plan": (["plan", "model=gpt-125m", "--json", "parallel.tp=2"],
             {"overrides": ["model=gpt-125m", "parallel.tp=2"], "json": True}),
    "tune": (["tune", "model=gpt-tiny", "--top", "4", "--steps", "10", "run.dir=X"],
             {"overrides": ["model=gpt-tiny", "run.dir=X"], "top": 4, "steps": 10}),
    "doctor": (["doctor", "cluster=ssh", "--iters", "2", "cluster.nnodes=2"],
               {"overrides": ["cluster=ssh", "cluster.nnodes=2"], "iters": 2}),
    "compare": (["compare", "runs/a", "--plot", "c.png", "runs/b"],
                {"dirs": ["runs/a", "runs/b"], "plot": "c.png"}),
    "data prepare": (["data", "prepare", "--output", "o.bin", "--input", "a", "b", "--workers", "2"],
                     {"input": ["a", "b"], "output": "o.bin", "workers": 2}),
    "ckpt diff": (["ckpt", "diff", "runs/a", "--atol", "0.001", "runs/b"],
                  {"a": "runs/a", "b": "runs/b", "atol": 0.001}),
    "ckpt export": (["ckpt", "export", "runs/a", "--format", "hf", "--out", "d"],
                    {"ckpt": "runs/a", "format": "hf", "out": "d"}),
}


@pytest.mark.parametrize("name", CASES)
def test_options_after_positionals_are_parsed(name):
    argv, expected = CASES[name]
    args = vars(build_parser().parse_args(argv))
    assert {k: args[k] for k in expected} == expected


def _leaves(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()):
    """(command words, parser) of every command that has no subcommands of its own."""
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subs:
        yield path, parser
        return
    for name, sub in subs[0].choices.items():
        yield from _leaves(sub, (*path, name))


def test_every_command_with_several_positionals_is_covered():
    """A command whose positionals take several values is one a user writes options after: it is in CASES."""
    covered = {tuple(argv[:2]) if argv[0] in ("data", "ckpt") else (argv[0],) for argv, _ in CASES.values()}
    many = {path for path, p in _leaves(build_parser())
            if any(a.nargs in ("*", "+") for a in p._actions if not a.option_strings)}
    assert many and many <= covered, sorted(many - covered)


def test_every_command_parses_options_anywhere():
    """Each command's own parser (those added later too) takes an option after a positional."""
    for path, parser in _leaves(build_parser()):
        assert type(parser).parse_known_args is not argparse.ArgumentParser.parse_known_args, path


def test_an_unknown_option_among_overrides_is_one_line_exit_2(capsys):
    with pytest.raises(SystemExit) as info:
        build_parser().parse_args(["launch", "model=gpt-tiny", "--bogus", "train.max_steps=5"])
    assert info.value.code == 2
    # What follows the unknown option is named with it: argparse cannot tell whose value it is.
    assert capsys.readouterr().err == ("llmtrain: error: unrecognized arguments: --bogus train.max_steps=5 (see "
                                       "llmtrain --help)\n")
