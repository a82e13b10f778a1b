"""`llmtrain launch -m` sweeps (expansion, dry run, local runs and their resume, Slurm submission) and `llmtrain
compare` over a sweep or run directories."""

from __future__ import annotations

import json
import os
import re
import stat
import sys
from pathlib import Path

import pytest
import yaml
from helpers.sweep_tables import PNG_MAGIC, table_rows  # noqa: F401

from llmtrain.cli import main


# ---------------------------------------------------------------------------------------------- expansion

def test_swept_values_expand_to_their_cartesian_product():
    from llmtrain.config import builtin_config_dir
    from llmtrain.sweep.expand import expand

    combos = expand(["train.lr=1e-3,3e-3", "model=gpt-tiny,gpt-125m", "train.seed=range(1,4)",
                     "+env.TAG='a,b'", "train.max_steps=5"], [builtin_config_dir()])
    assert len(combos) == 12
    assert combos[0].dir_name == "lr=0.001,model=gpt-tiny,seed=1"
    assert combos[11].dir_name == "lr=0.003,model=gpt-125m,seed=3"
    assert combos[1].swept == {"train.lr": "0.001", "model": "gpt-tiny", "train.seed": "2"}  # last key fastest
    assert combos[5].overrides == ("train.lr=0.001", "model=gpt-125m", "train.seed=3", "+env.TAG='a,b'",
                                   "train.max_steps=5")
    globbed = expand(["model=glob(gpt-1*,exclude=gpt-13b)"], [builtin_config_dir()])
    assert [c.swept["model"] for c in globbed] == ["gpt-1.3b", "gpt-125m", "gpt-175b"]
    long = expand(["+env.X=" + "a" * 200 + ",b/c d"], [builtin_config_dir()])
    assert len(long[0].dir_name) == 96 and re.fullmatch(r"X=a{85}-[0-9a-f]{8}", long[0].dir_name)
    assert re.fullmatch(r"X=b_c_d-[0-9a-f]{8}", long[1].dir_name)  # changed by the sanitizing: hashed


@pytest.mark.parametrize("override,key,words", [
    ("train.lr=interval(0,1)", "train.lr", "continuous range"),
    ("train.seed=shuffle(1,2,3)", "train.seed", "another order each time"),
    ("run.dir=a,b", "run.dir", "give it one value"),
    ("train.lr=glob(*)", "train.lr", "is not one"),
    ("train.lr=[1,2", "train.lr", "cannot read 'train.lr=[1,2': no viable alternative"),
    ("run.name=it's", "run.name", """quote it: run.name="it's" (in a shell: "run.name=\\"it's\\"")"""),
])
def test_sweeps_llmtrain_cannot_run_are_one_line(override, key, words, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code = main(["launch", "-m", override])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1, err
    assert err.startswith(f"llmtrain: error: {key}:") and words in err, err
    assert list(tmp_path.iterdir()) == []


def test_a_comma_list_without_m_says_to_sweep_with_m(capsys):
    assert main(["launch", "train.lr=1e-3,3e-3"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "give one value" in err and "use -m to sweep" in err, err


# ---------------------------------------------------------------------------------------------- dry run

def test_a_bad_combination_fails_the_dry_run_naming_it(tmp_path, capsys):
    sweep = tmp_path / "sweep"
    for dry in (["--dry-run"], []):  # a real sweep refuses it the same way, before anything is written
        code = main(["launch", "-m", *dry, f"run.dir={sweep}", "cluster.nproc_per_node=2", "parallel.tp=1,3"])
        err = capsys.readouterr().err
        assert code == 2 and err.count("\n") == 1, err
        assert err.startswith("llmtrain: error: parallel.tp:") and "(in sweep run tp=3)" in err, err
        assert not sweep.exists()


def test_dry_run_lists_every_run_with_its_commands(tmp_path, capsys):
    sweep = tmp_path / "sweep"
    assert main(["launch", "-m", "--dry-run", f"run.dir={sweep}", "train.lr=1e-3,3e-3", "train.seed=1,2"]) == 0
    out = capsys.readouterr().out
    dirs = [sweep / name for name in ("lr=0.001,seed=1", "lr=0.001,seed=2",
                                      "lr=0.003,seed=1", "lr=0.003,seed=2")]
    assert [row[-1] for row in table_rows(out)] == [str(d) for d in dirs]
    for d in dirs:  # each run's own worker command, and the sweep's name in its environment
        assert f"-m llmtrain.worker {d}\n" in out
    assert out.count("LLMTRAIN_SWEEP_NAME=sweep\n") == 4
    assert not sweep.exists()


def test_slurm_dry_run_shows_one_job_per_run(tmp_path, capsys):
    sweep = tmp_path / "sweep"
    assert main(["launch", "-m", "--dry-run", f"run.dir={sweep}", "cluster=slurm", "cluster.nnodes=1",
                 "train.lr=1e-3,3e-3"]) == 0
    out = capsys.readouterr().out
    assert out.count("#!/bin/bash\n") == 2
    outputs = [ln for ln in out.splitlines() if ln.startswith("#SBATCH --output=")]
    assert outputs == [f'#SBATCH --output="{sweep}/lr=0.001/logs/slurm-%j.out"',
                       f'#SBATCH --output="{sweep}/lr=0.003/logs/slurm-%j.out"']
    names = [ln for ln in out.splitlines() if ln.startswith("#SBATCH --job-name=")]
    assert names == ['#SBATCH --job-name="llmtrain-sweep-0"', '#SBATCH --job-name="llmtrain-sweep-1"']
    assert not sweep.exists()


def test_slurm_runs_are_not_followed_so_all_are_submitted_at_once():
    from llmtrain.sweep.plan import plan_sweep

    plan = plan_sweep(["cluster=slurm", "cluster.nnodes=1", "cluster.follow=true", "train.lr=1e-3,3e-3"])
    assert [run.cfg.cluster.follow for run in plan.runs] == [False, False]


# ---------------------------------------------------------------------------------------------- one sweep per folder

def planned(sweep: Path, *overrides: str):
    from llmtrain.sweep.plan import plan_sweep

    return plan_sweep([f"run.dir={sweep}", *overrides])


def written(sweep: Path, *overrides: str) -> dict:
    """Plan a sweep and write its sweep.yaml as a launch does before its first run (nothing is launched)."""
    from llmtrain.sweep import record

    record.write(planned(sweep, *overrides))
    return yaml.safe_load((sweep / "sweep.yaml").read_text())


def test_a_run_folder_is_named_by_its_values_not_its_position(tmp_path):
    sweep = tmp_path / "sweep"
    written(sweep, "train.lr=1e-3,3e-3", "train.max_steps=3")
    # A value added in front: the runs there keep their folders; only the new one gets a new folder.
    plan = planned(sweep, "train.lr=3e-4,1e-3,3e-3", "train.max_steps=3")
    assert [run.name for run in plan.runs] == ["lr=0.0003", "lr=0.001", "lr=0.003"]
    assert [run.dir for run in plan.runs] == [str(sweep / n) for n in ("lr=0.0003", "lr=0.001", "lr=0.003")]
    index = written(sweep, "train.lr=3e-4,1e-3,3e-3", "train.max_steps=3")
    assert [(r["index"], r["dir"], r["params"]) for r in index["runs"]] == [
        (0, "lr=0.001", {"train.lr": "0.001"}), (1, "lr=0.003", {"train.lr": "0.003"}),
        (2, "lr=0.0003", {"train.lr": "0.0003"})]
    assert index["overrides"][1] == "train.lr=3e-4,1e-3,3e-3"
    # Fewer values again: the sweep keeps every run it listed.
    assert [r["dir"] for r in written(sweep, "train.lr=1e-3,3e-3", "train.max_steps=3")["runs"]] == [
        "lr=0.001", "lr=0.003", "lr=0.0003"]


def test_folders_named_by_position_earlier_are_found_again_by_their_values(tmp_path):
    sweep = tmp_path / "sweep"
    sweep.mkdir()
    (sweep / "sweep.yaml").write_text(yaml.safe_dump({
        "sweep": "sweep", "overrides": [f"run.dir={sweep}", "train.lr=1e-3,3e-3"], "config_dirs": [],
        "swept": ["train.lr"], "backend": "local",
        "runs": [{"index": i, "dir": f"{i}-train.lr={v}", "params": {"train.lr": v},
                  "overrides": [f"train.lr={v}", f"run.dir={sweep}"]} for i, v in enumerate(["0.001", "0.003"])]}))
    plan = planned(sweep, "train.lr=3e-4,1e-3,3e-3")
    assert [run.name for run in plan.runs] == ["lr=0.0003", "0-train.lr=0.001", "1-train.lr=0.003"]


@pytest.mark.parametrize("then,now,differs", [
    (["train.lr=1e-3,3e-3", "train.max_steps=3"], ["train.lr=1e-3,3e-3", "train.max_steps=5"],
     "its other overrides train.max_steps=3 are train.max_steps=5 here"),
    (["train.lr=1e-3,3e-3"], ["train.seed=1,2"], "it sweeps train.lr, this command train.seed"),
    (["train.lr=1e-3,3e-3"], ["train.lr=1e-3,3e-3", "train.seed=1,2"],
     "it sweeps train.lr, this command train.lr train.seed"),
])
def test_another_sweep_into_a_sweep_folder_is_refused_and_nothing_is_written(tmp_path, capsys, then, now, differs):
    sweep = tmp_path / "sweep"
    written(sweep, *then)
    before = (sweep / "sweep.yaml").read_bytes()
    for dry in (["--dry-run"], []):
        code = main(["launch", "-m", *dry, f"run.dir={sweep}", *now])
        err = capsys.readouterr().err
        assert code == 2 and err == (f"llmtrain: error: run.dir: {sweep} holds another sweep ({differs}); nothing "
                                     f"was started or written: give run.dir={sweep}-2 for a new sweep (more values "
                                     "of the same keys, with the same other overrides, extend that one)\n"), err
    assert (sweep / "sweep.yaml").read_bytes() == before and sorted(os.listdir(sweep)) == ["sweep.yaml"]


def test_default_sweep_folders_of_one_model_are_told_apart(tmp_path, capsys, monkeypatch):
    """Two sweeps of one model without run.dir land in the same runs/<model>-sweep: the second is refused."""
    from llmtrain.sweep import record
    from llmtrain.sweep.plan import plan_sweep

    monkeypatch.chdir(tmp_path)
    first = plan_sweep(["train.lr=1e-3,3e-3"])
    record.write(first)
    assert main(["launch", "-m", "train.seed=1,2"]) == 2
    err = capsys.readouterr().err
    assert f"{first.dir} holds another sweep (it sweeps train.lr, this command train.seed)" in err, err


def test_one_combination_given_twice_is_refused():
    from llmtrain.config import builtin_config_dir
    from llmtrain.config.errors import ConfigError
    from llmtrain.sweep.expand import expand

    with pytest.raises(ConfigError) as e:
        expand(["train.lr=1e-3,0.001"], [builtin_config_dir()])
    assert e.value.key == "train.lr" and "the combination train.lr=0.001 twice (runs 0 and 1)" in e.value.message


# ---------------------------------------------------------------------------------------------- slurm

def fake_program(folder: Path, name: str, body: str) -> None:
    """An executable that appends its arguments to folder/NAME.calls, then runs body."""
    folder.mkdir(exist_ok=True)
    path = folder / name
    path.write_text(f'#!/bin/bash\necho "$*" >> {folder}/{name}.calls\n{body}\n')
    path.chmod(path.stat().st_mode | stat.S_IEXEC)


def test_slurm_sweep_submits_every_run_at_once_and_a_rerun_leaves_them(tmp_path, capsys, monkeypatch):
    bin_dir, sweep = tmp_path / "bin", tmp_path / "sweep"
    fake_program(bin_dir, "sbatch", "echo $((1000 + $(wc -l < $(dirname $0)/sbatch.calls)))")
    fake_program(bin_dir, "scontrol", 'echo "JobId=$3 JobName=x JobState=RUNNING Reason=None"')
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    args = ["launch", "-m", f"run.dir={sweep}", "cluster=slurm", "cluster.nnodes=1", "cluster.nproc_per_node=1",
            "train.lr=1e-3,3e-3"]
    assert main(args) == 0
    out = capsys.readouterr().out
    calls = (bin_dir / "sbatch.calls").read_text().splitlines()
    assert calls == [f"--parsable {sweep}/lr=0.001/slurm/job.sbatch",
                     f"--parsable {sweep}/lr=0.003/slurm/job.sbatch"]
    assert "Slurm job 1001" in out and "Slurm job 1002" in out
    assert "sweep sweep: 2 run(s): 2 submitted" in out
    # Again: both jobs hold their run directories, so nothing is submitted twice.
    assert main(args) == 0
    out = capsys.readouterr().out
    assert out.count("llmtrain: sweep: skipping ") == 2 and "running (Slurm job 100" in out, out
    assert len((bin_dir / "sbatch.calls").read_text().splitlines()) == 2


# ---------------------------------------------------------------------------------------------- local, end to end


# ---------------------------------------------------------------------------------------------- compare

def fake_run(run_dir: Path, overrides: list[str], losses: list[float], val: float | None, tokens_per_step: int):
    """A run directory as a launch leaves it: config.yaml and metrics.jsonl."""
    from llmtrain.config import compose_config, to_yaml

    run_dir.mkdir(parents=True)
    (run_dir / "config.yaml").write_text(to_yaml(compose_config([f"run.dir={run_dir}", *overrides])))
    rows = [{"step": s, "loss": loss, "tokens_per_s": 1000.0 * s, "mfu": 0.01 * s, "peak_tflops": 1.0,
             "tokens": s * tokens_per_step}
            for s, loss in enumerate(losses, 1)]
    if val is not None:
        rows.append({"step": len(losses), "val_loss": val})
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_compare_runs_shows_differing_keys_sorted_and_batch_differences(tmp_path, capsys):
    fake_run(tmp_path / "a", ["train.lr=0.001"], [5.0, 4.0, 3.5], 3.9, 8 * 128)
    fake_run(tmp_path / "b", ["train.lr=0.002", "train.global_batch_size=32"], [5.0, 3.9, 3.0], 3.1, 32 * 128)
    fake_run(tmp_path / "c", ["train.lr=0.003"], [5.0, 4.5, 4.4], None, 8 * 128)
    plot = tmp_path / "all.png"
    code = main(["compare", str(tmp_path / "c"), str(tmp_path / "a"), str(tmp_path / "b"), "--plot", str(plot)])
    out = capsys.readouterr().out
    assert code == 0
    rows = table_rows(out)
    # Only the keys that differ; best val loss first, the run without one last; medians leave out step 1.
    assert rows == [["b", "32", "0.002", "3.0000", "3.1000", "2,500", "2.5%", "3/300"],
                    ["a", "16", "0.001", "3.5000", "3.9000", "2,500", "2.5%", "3/300"],
                    ["c", "16", "0.003", "4.4000", "-", "2,500", "2.5%", "3/300"]]
    header = next(ln for ln in out.splitlines() if ln.startswith("┃"))
    assert [h.strip() for h in header.strip("┃").split("┃")][:3] == ["run", "train.global_batch_size", "train.lr"]
    assert "note: the global batch differs between the runs" in out and "32 x 128 = 4,096 tokens per step in b" in out
    assert "note: the runs saw different numbers of tokens: 3,072 in c, a; 12,288 in b" in out
    assert plot.read_bytes()[:8] == PNG_MAGIC


def test_compare_without_matplotlib_prints_the_table_and_how_to_get_the_plot(tmp_path, capsys, monkeypatch):
    fake_run(tmp_path / "a", ["train.lr=0.001"], [5.0, 4.0], 3.9, 1024)
    fake_run(tmp_path / "b", ["train.lr=0.002"], [5.0, 3.5], 3.4, 1024)
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib raises ImportError
    assert main(["compare", str(tmp_path / "a"), str(tmp_path / "b")]) == 0
    captured = capsys.readouterr()
    assert table_rows(captured.out)[:2] == [["b", "0.002", "3.5000", "3.4000", "2,000", "2.0%", "2/300"],
                                            ["a", "0.001", "4.0000", "3.9000", "2,000", "2.0%", "2/300"]]
    assert captured.out.splitlines()[-1] == ("plots: none, matplotlib is not installed; for PNG plots: pip install "
                                             "'llmtrain[plot]' (in a checkout: pip install -e '.[plot]')")
    assert captured.err == "" and not (tmp_path / "a" / "compare.png").exists()
    # A PNG asked for by name cannot be made: one line, exit 2, nothing printed or written.
    plot = tmp_path / "all.png"
    assert main(["compare", str(tmp_path / "a"), "--plot", str(plot)]) == 2
    captured = capsys.readouterr()
    assert captured.err == (f"llmtrain: error: --plot: {plot} needs matplotlib, which is not installed: pip install "
                            "'llmtrain[plot]' (in a checkout: pip install -e '.[plot]'); without --plot, compare "
                            "prints the table alone\n")
    assert captured.out == "" and not plot.exists()


def test_compare_refuses_a_folder_that_is_neither_a_run_nor_a_sweep(tmp_path, capsys):
    assert main(["compare", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "nor a sweep directory (no sweep.yaml)" in err, err


