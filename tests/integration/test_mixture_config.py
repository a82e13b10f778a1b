"""data=mix around the launch: each source checked before it (one line naming the source), the mixture's identity
in checkpoints and the resume diff by source, the sources mounted into a container, --dry-run's mixture lines and
the per-source tables of `llmtrain report`."""

from __future__ import annotations

import argparse
import json
import os

import pytest
from omegaconf import OmegaConf

from llmtrain.checkpoint.diff import describe_change
from llmtrain.cli import main
from llmtrain.config import ConfigError, compose_config
from llmtrain.launch.config_probes import validate_here
from llmtrain.data.identity import data_changes, data_identity
from llmtrain.data.mixture_config import source_names
from llmtrain.launch.container import own_paths
from helpers.bytes_edit import flip

SEQ = 128  # gpt-tiny's model.seq_len


def token_file(path, n: int, dtype: str = "uint16", tokenizer: str | None = "byte", vocab: int = 256) -> str:
    size = {"uint16": 2, "uint32": 4}[dtype]
    with open(path, "wb") as f:
        f.write(bytes((i * 7) % 251 for i in range(n * size)))
    meta = {"format": "llmtrain-tokens-v1", "dtype": dtype, "vocab_size": vocab, "num_tokens": n}
    if tokenizer:
        meta["tokenizer"] = tokenizer
    with open(f"{path}.json", "w") as f:
        json.dump(meta, f)
    return str(path)


def shard_folder(folder, counts: list[int], dtype: str = "uint32", tokenizer: str = "byte") -> str:
    os.makedirs(folder, exist_ok=True)
    shards = []
    for i, n in enumerate(counts):
        token_file(os.path.join(folder, f"shard-{i:05d}.bin"), n, dtype, tokenizer)
        shards.append({"file": f"shard-{i:05d}.bin", "num_tokens": n})
    index = {"format": "llmtrain-shards-v1", "dtype": dtype, "vocab_size": 256, "tokenizer": tokenizer,
             "num_tokens": sum(counts), "shards": shards}
    with open(os.path.join(folder, "index.json"), "w") as f:
        json.dump(index, f)
    return str(folder)


def sources(*entries: str) -> str:
    return "data.sources=[" + ", ".join(entries) + "]"


def mix(*overrides: str):
    cfg = compose_config(["data=mix", "model=gpt-tiny", "train.max_steps=10", *overrides])
    validate_here(cfg)
    return cfg


@pytest.fixture
def data(tmp_path):
    """web/: two uint32 shards (30,000 tokens); code.bin: 3,000 uint16 tokens; both byte-level."""
    return {"web": shard_folder(tmp_path / "web", [20_000, 10_000]), "code": token_file(tmp_path / "code.bin", 3000)}


def test_source_names_are_the_name_else_the_stem():
    assert source_names([{"path": "a/code.bin"}, {"path": "web/"}, {"path": "x.bin", "name": "math"},
                         {"path": ".hidden"}, {"path": "t.tar.gz"}]) == ["code", "web", "math", ".hidden", "t"]


def test_a_valid_mixture_of_uint16_and_uint32_sources(data):
    from llmtrain.data.mixture_checks import check_mixture

    cfg = mix(sources(f"{{path: {data['web']}, weight: 0.7}}", f"{{path: {data['code']}, weight: 0.35}}"))
    checked = check_mixture(cfg)
    assert [(s.name, s.facts.num_tokens, s.facts.dtype) for s in checked] == [("web", 30_000, "uint32"),
                                                                             ("code", 3000, "uint16")]
    assert [round(s.share, 6) for s in checked] == [round(0.7 / 1.05, 6), round(0.35 / 1.05, 6)]
    assert len(checked[0].facts.files) == 2


BAD = [  # (sources override or other overrides, key, start of the message)
    (["data.sources=[]"], "data.sources", "data=mix needs at least one source"),
    ([], "data.sources", "data=mix needs at least one source"),
    ([sources("{weight: 1}")], "data.sources[0].path", "every source needs a path"),
    ([sources("{path: WEB}", "{path: NOPE/nope.bin}")], "data.sources[1].path", "source nope: no such file: "),
    ([sources("{path: WEB}", "{path: TINY}")], "data.sources[1].path",
     f"source tiny (TINY) has 100 tokens, 95 of them for training at data.val_fraction=0.05; one training "
     f"sequence needs model.seq_len+1 = {SEQ + 1}"),
    ([sources("{path: WEB}", "{path: SMALL}")], "data.sources[1].path",
     "source small (SMALL) has 200 tokens, 10 of them for validation"),
    ([sources("{path: WEB}"), "model.vocab_size=100"], "model.vocab_size",
     "is 100 but source web (WEB) has vocab_size 256; set model.vocab_size=256"),
    ([sources("{path: CODE, weight: -1}")], "data.sources[0].weight", "must be a finite number >= 0 (got -1.0)"),
    ([sources("{path: CODE, weight: nan}")], "data.sources[0].weight", "must be a finite number >= 0 (got nan)"),
    ([sources("{path: CODE, weight: 0}", "{path: WEB, weight: 0}")], "data.sources",
     "the weights sum to 0: give at least one source a weight > 0"),
    ([sources("{path: CODE}", "{path: SUB/code.bin}")], "data.sources[1].path",
     "SUB/code.bin and data.sources[0].path CODE are both named code (a source without a name is named after its "
     "file or folder); give them distinct names"),
    ([sources("{path: CODE, name: a}", "{path: WEB, name: a}")], "data.sources[1].name",
     "source name a is also the name of data.sources[0]"),
    ([sources("{path: WEB}", "{path: TOKA}")], "data.sources[1].path",
     "source toka was prepared with the tokenizer TOK_A and source web with byte-level tokens; the sources of a "
     "mixture must share one tokenizer"),
    ([sources("{path: TOKA}", "{path: TOKB}")], "data.sources[1].path",
     "source tokb was prepared with the tokenizer TOK_B and source toka with the tokenizer TOK_A"),
    ([sources("{path: WEB}"), "data.dtype=uint16"], "data.dtype",
     "is uint16 but WEB/index.json says uint32; set data.dtype=uint32 (or null) (source web, data.sources[0].path)"),
    ([sources("{path: CODE}", "{path: SUB}")], "data.sources[1].path",
     "source sub: SUB is a folder without index.json"),
    ([sources("{path: WEB}"), "data.path=x.bin"], "data.path", "is not used by data=mix"),
    ([sources("{path: WEB, wieght: 0.3}")], "data.sources[0].wieght",
     "unknown key (not in the schema; did you mean data.sources[0].weight?)"),
    ([sources("{path: WEB}", "{path: CODE, nmae: c}")], "data.sources[1].nmae", "unknown key (not in the schema; "
                                                                                "did you mean data.sources[1].name?)"),
    ([sources("WEB")], "data.sources[0]", "each source is a mapping {path: FILE_OR_FOLDER, weight: W, name: NAME}"),
]


@pytest.fixture
def files(tmp_path, data):
    sub = tmp_path / "sub"
    sub.mkdir()
    token_file(sub / "code.bin", 3000)
    tok_a, tok_b, tok_copy = (tmp_path / "a.json", tmp_path / "b.json", tmp_path / "copy.json")
    tok_a.write_text('{"model": "a"}')
    tok_b.write_text('{"model": "b"}')
    tok_copy.write_text('{"model": "a"}')
    return {"WEB": data["web"], "CODE": data["code"], "NOPE": str(tmp_path), "SUB": str(sub),
            "TINY": token_file(tmp_path / "tiny.bin", 100), "SMALL": token_file(tmp_path / "small.bin", 200),
            "TOKA": token_file(tmp_path / "toka.bin", 3000, tokenizer=str(tok_a)),
            "TOKB": token_file(tmp_path / "tokb.bin", 3000, tokenizer=str(tok_b)),
            "TOKCOPY": token_file(tmp_path / "tokcopy.bin", 3000, tokenizer=str(tok_copy)),
            "TOK_A": str(tok_a), "TOK_B": str(tok_b)}


def fill(text: str, files: dict) -> str:
    for name in sorted(files, key=len, reverse=True):
        text = text.replace(name, files[name])
    return text


@pytest.mark.parametrize("overrides,key,message", BAD, ids=[k + ":" + m[:30] for _, k, m in BAD])
def test_bad_mixtures_are_one_line_naming_the_source(overrides, key, message, files):
    with pytest.raises(ConfigError) as info:
        mix(*(fill(o, files) for o in overrides))
    assert (info.value.key, info.value.message[:len(fill(message, files))]) == (key, fill(message, files))


def test_same_tokenizer_in_two_copies_and_no_validation_split_needed_without_eval(files):
    mix(sources(f"{{path: {files['TOKA']}}}", f"{{path: {files['TOKCOPY']}}}"))
    mix(sources(f"{{path: {files['SMALL']}}}"), "train.eval_interval=0")  # 10 val tokens: fine without evaluation


def test_launch_refuses_with_one_line_and_exit_2(files, tmp_path, capsys):
    run_dir = tmp_path / "run"
    code = main(["launch", f"run.dir={run_dir}", "data=mix", "model=gpt-tiny", "train.max_steps=1",
                 sources(f"{{path: {files['WEB']}}}", f"{{path: {files['TINY']}}}")])
    lines = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and not run_dir.exists()
    assert lines[0].startswith(f"llmtrain: error: data.sources[1].path: source tiny ({files['TINY']}) has 100 tokens")


def test_a_typo_inside_a_source_in_a_yaml_file_names_the_file(files, tmp_path, capsys):
    folder = tmp_path / "conf" / "data"
    folder.mkdir(parents=True)
    (folder / "mine.yaml").write_text(f"name: mix\nsources:\n  - path: {files['WEB']}\n    wieght: 0.5\n")
    with pytest.raises(ConfigError) as info:
        compose_config(["data=mine"], config_dirs=[str(tmp_path / "conf")])
    assert (info.value.key, info.value.message) == (
        "data.sources[0].wieght", f"unknown key in {folder / 'mine.yaml'} (not in the schema; did you mean "
                                  "data.sources[0].weight?)")


def test_dry_run_prints_each_source_and_warns_of_repeats(data, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "250")
    args = ["launch", "--dry-run", f"run.dir={tmp_path / 'run'}", "data=mix", "model=gpt-tiny", "train.max_steps=40",
            sources(f"{{path: {data['web']}, weight: 3}}", f"{{path: {data['code']}, weight: 1}}")]
    assert main(args) == 0
    out = capsys.readouterr().out
    gbs = compose_config(args[3:]).train.global_batch_size
    samples = 40 * gbs
    web_windows, code_windows = (28_500 - 1) // SEQ, (2850 - 1) // SEQ  # train split: 95% of the tokens
    assert f"data=mix: 2 source(s); train.max_steps=40 x {gbs} samples of {SEQ} tokens = {samples:,} samples" in out
    assert (f"  web   {data['web']} (30,000 tokens uint32, 2 shards)  weight 3 (75.0%)  {0.75 * samples * SEQ:,.0f} "
            f"tokens drawn = {0.75 * samples / web_windows:.2f} epochs") in out
    assert (f"  code  {data['code']} (3,000 tokens uint16)  weight 1 (25.0%)  {0.25 * samples * SEQ:,.0f} tokens "
            f"drawn = {0.25 * samples / code_windows:.2f} epochs") in out
    code_epochs = 0.25 * samples / code_windows
    assert code_epochs > 4 > 0.75 * samples / web_windows  # only code is over the line
    assert f"llmtrain: warning: source code would be repeated {code_epochs:.1f} times" in out
    assert "source web would be repeated" not in out and not (tmp_path / "run").exists()


def mix_cfg(*entries: dict):
    return OmegaConf.create({"name": "mix", "path": None, "sources": list(entries)})


def test_mixture_identity_by_source(data, tmp_path):
    web, code = {"path": data["web"], "weight": 0.7}, {"path": data["code"], "weight": 0.3}
    recorded = data_identity(mix_cfg(web, code))
    assert sorted(recorded["sources"]) == ["code", "web"] and recorded["sources"]["web"]["bytes"] == 120_000
    # Another mixture of the same data: reweighted, a source added or dropped.
    math_file = token_file(tmp_path / "math.bin", 3000)
    for now in (mix_cfg({**web, "weight": 0.5}, code), mix_cfg(web), mix_cfg(web, code, {"path": math_file})):
        assert data_changes(recorded, now) == ""
    flip(os.path.join(data["web"], "shard-00001.bin"), 10)  # inside the second shard's first sampled block
    change = data_changes(recorded, mix_cfg(web, code))
    assert change.startswith(f"source web: {data['web']}: its sampled blocks differ (blake2b ")
    assert "code" not in change
    # data=memmap recorded, data=mix now: other data; and an old checkpoint without an identity resumes.
    memmap = data_identity(OmegaConf.create({"name": "memmap", "path": data["code"]}))
    assert data_changes(memmap, mix_cfg(code)) == f"trained on {data['code']}, now data=mix (code)"
    assert data_changes(recorded, OmegaConf.create({"name": "memmap", "path": data["code"]})) == (
        f"trained on data=mix (web, code), now {data['code']}")
    assert data_changes(None, mix_cfg(web)) == ""


def test_a_changed_source_refuses_the_resume_in_the_same_run_dir(data, tmp_path, monkeypatch):
    from llmtrain.checkpoint import store
    from llmtrain.launch import run_identity

    cfg = mix(sources(f"{{path: {data['web']}, weight: 0.7}}", f"{{path: {data['code']}, weight: 0.3}}"),
              f"run.dir={tmp_path / 'run'}")
    recorded = data_identity(cfg.data)
    ckpt = os.path.join(store.checkpoints_dir(str(tmp_path / "run")), "step_00000010")

    class Info:  # the run directory's one checkpoint, as store lists it
        path, step, complete = ckpt, 10, True

    monkeypatch.setattr(store, "latest_complete", lambda run_dir: (Info, []))
    monkeypatch.setattr(store, "list_checkpoints", lambda run_dir: [Info])
    monkeypatch.setattr(store, "read_meta", lambda path: {"step": 10, "data": recorded})
    assert run_identity.conflict(cfg, str(tmp_path / "run"), ckpt, cfg) == ("", [])
    token_file(data["code"], 3000, tokenizer=None)  # same tokens, another meta
    why, aside = run_identity.conflict(cfg, str(tmp_path / "run"), ckpt, cfg)
    assert why.startswith(f"other data (data.sources: source code: {data['code']}: its meta {data['code']}.json "
                          "changed) would start a new run in ")
    assert aside == [ckpt]


def test_resume_diff_shows_the_mixture_by_source():
    before = [{"path": "web/", "weight": 0.7, "name": None}, {"path": "c/code.bin", "weight": 0.3, "name": None}]
    after = [{"path": "web/", "weight": 0.5, "name": None}, {"path": "c/code.bin", "weight": 0.5, "name": None},
             {"path": "math.bin", "weight": 0.2, "name": None}]
    assert describe_change("data.sources", before, after) == (
        "web weight 0.7 -> 0.5, code weight 0.3 -> 0.5, + math (new, weight 0.2); the stream continues from the "
        "samples each source has consumed")
    assert describe_change("data.sources", after, before[:1]) == (
        "web weight 0.5 -> 0.7, - code (dropped, was weight 0.5), - math (dropped, was weight 0.2); the stream "
        "continues from the samples each source has consumed")
    assert describe_change("train.lr", 0.1, 0.2) == "0.1 -> 0.2"


def test_every_source_folder_is_mounted_into_a_container(data):
    cfg = compose_config(["data=mix", sources(f"{{path: {data['web']}}}", f"{{path: {data['code']}}}")])
    paths = own_paths(cfg, "/work", "/runs/a")
    assert paths == {"cluster.workdir": "/work", "run.dir": "/runs/a", "data.sources[0].path": data["web"],
                     "data.sources[1].path": os.path.dirname(data["code"])}
    assert own_paths(compose_config(["data=mix"]), "/work", "/runs/a") == {"cluster.workdir": "/work",
                                                                           "run.dir": "/runs/a"}


def test_report_shows_tokens_and_val_loss_per_source(tmp_path, capsys, monkeypatch):
    from llmtrain.report.run_report import add_report_arguments, run_report

    monkeypatch.setenv("COLUMNS", "200")
    rows = [{"step": 1, "loss": 5.0, "tokens": 256, "source_tokens": {"web": 192, "code": 64}, "data_wait_ms": 0.4},
            {"step": 2, "loss": 4.0, "tokens": 512, "source_tokens": {"web": 390, "code": 122}, "data_wait_ms": 0.3},
            {"step": 2, "val_loss": 4.5, "source_val_loss": {"web": 4.25, "code": 4.75}},
            {"step": 3, "loss": 3.5, "tokens": 768, "source_tokens": {"web": 580, "code": 188}},
            {"step": 3, "val_loss": 4.0, "source_val_loss": {"web": 3.8125, "code": 4.1875}}]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    parser = argparse.ArgumentParser()
    add_report_arguments(parser)
    assert run_report(parser.parse_args([str(tmp_path)])) == 0
    out = capsys.readouterr().out
    assert "data=mix sources (val loss at step 3)" in out
    table = [line.split() for line in out.splitlines() if line.strip("│ ").startswith(("web", "code"))]
    assert [[c for c in row if c != "│"] for row in table] == [["web", "580", "75.5%", "3.8125"],
                                                               ["code", "188", "24.5%", "4.1875"]]
    png = tmp_path / "report" / "source_val_loss.png"
    assert ("matplotlib" not in out) == png.is_file()


def test_compare_shows_a_mixture_by_name_and_weight():
    from llmtrain.report.compare import Run, differing_keys, key_value

    runs = [Run(name, [], compose_config(["data=mix", sources(f"{{path: w/web/, weight: {w}}}", "{path: code.bin}")]))
            for name, w in (("a", 0.7), ("b", 0.5))]
    assert differing_keys(runs) == ["data.sources"]
    assert [key_value(run, "data.sources", False) for run in runs] == ["web 0.7, code 1.0", "web 0.5, code 1.0"]


def test_the_launcher_prints_the_mixture_change_on_resume(data, tmp_path, capsys, monkeypatch):
    from llmtrain.checkpoint import store
    from llmtrain.checkpoint.resume import Resolution
    from llmtrain.config import to_yaml
    from llmtrain.console import get_console
    from llmtrain.launch import run, run_identity

    old = mix(sources(f"{{path: {data['web']}, weight: 0.7}}", f"{{path: {data['code']}, weight: 0.3}}"))
    new = mix(sources(f"{{path: {data['web']}, weight: 0.5}}", f"{{path: {data['code']}, weight: 0.5}}"),
              f"run.dir={tmp_path / 'run'}")
    old.run.dir = new.run.dir
    ckpt = str(tmp_path / "run" / "checkpoints" / "step_00000010")
    os.makedirs(ckpt)
    with open(os.path.join(ckpt, "config.yaml"), "w") as f:
        f.write(to_yaml(old))
    monkeypatch.setattr(run, "resolve_resume", lambda run_dir, value: Resolution(value, ckpt, "PATH as given"))
    monkeypatch.setattr(store, "verify", lambda path, **_: None)
    monkeypatch.setattr(store, "read_meta", lambda path: {"step": 10, "data": data_identity(old.data)})
    monkeypatch.setattr(run_identity, "conflict", lambda *args: ("", []))
    assert run.check_resume(new, get_console(width=300)).checkpoint == ckpt
    lines = capsys.readouterr().out.splitlines()
    assert lines == [f"llmtrain: resuming from {ckpt} with these changes:",
                     "  data.sources: web weight 0.7 -> 0.5, code weight 0.3 -> 0.5; the stream continues from the "
                     "samples each source has consumed"]
