"""A start on fewer nodes than cluster.nnodes (cluster.min_nnodes): which layout replan picks for which node count,
the refusals before launch (check_shapes), the start's record that every worker applies (config_for_start), the
start's line (shape_line), and the sbatch script of a run that accepts fewer nodes. All in-process: the plan's
memory model and plan --suggest's search, no torchrun."""

from __future__ import annotations

import pytest
from helpers.fake_slurm import fake, slurm_cfg  # noqa: F401  (fake: the fixture)

from llmtrain.config import ConfigError
from llmtrain.launch.backends.slurm import SlurmBackend
from llmtrain.launch.config_probes import compose_here, validate_here
from llmtrain.launch.shape.check import check_shapes, elastic, min_nnodes
from llmtrain.launch.shape.replan import StartShape, _peak_fits, replan, same_layout, shape_line, with_overrides
from llmtrain.launch.shape.start_record import SHAPE, STARTS, config_for_start, record_facts

# A GPU profile: plan --suggest's search ranks layouts at the profile's peak, not at this CPU's speed measured now.
H100 = ("hardware=h100", "precision=bf16")
NOTHING_FITS = ("cluster.min_nnodes: on 1 node(s) (8 ranks) no layout is valid and fits by llmtrain plan's memory "
                "model (try llmtrain plan --suggest 8); raise cluster.min_nnodes")


@pytest.fixture(autouse=True)
def _uncalibrated(tmp_path, monkeypatch):
    """No `llmtrain tune` calibration but this test's own (none): the search ranks by the profiles alone."""
    monkeypatch.setenv("LLMTRAIN_CACHE", str(tmp_path / "cache"))


def cfg(*overrides: str, nnodes: int = 2, per_node: int = 2, fewest: int | None = 1):
    c = compose_here(["cluster=slurm", "device=cpu", f"cluster.nnodes={nnodes}", f"cluster.nproc_per_node={per_node}",
                      f"cluster.min_nnodes={'null' if fewest is None else fewest}", *overrides])
    validate_here(c)
    return c


def accumulation(c) -> int:
    """Micro-batches per dp rank in one step."""
    return c.train.global_batch_size // (c.train.micro_batch_size * c.parallel.dp)


# ------------------------------------------------------------------------------------------------- the layout rule
def test_dp4_on_two_nodes_keeps_tp_x_pp_on_one_with_dp2_and_twice_the_micro_batches():
    full = cfg()
    assert (full.parallel.dp, full.train.global_batch_size, full.train.micro_batch_size) == (4, 16, 4)
    shape = replan(full, 1)
    assert shape == StartShape(1, {"cluster.nnodes": 1, "parallel.dp": 2}, "same tp x pp")
    one = with_overrides(full, shape.overrides)
    assert (one.parallel.tp, one.parallel.pp, one.parallel.dp) == (1, 1, 2)
    assert (accumulation(full), accumulation(one)) == (1, 2)
    assert one.train.global_batch_size == 16
    # The config's own node count: the config as it is.
    assert replan(full, 2) == StartShape(2, {}, "as configured")


def test_a_micro_batch_that_no_longer_divides_a_ranks_share_is_fitted_again():
    full = cfg("train.global_batch_size=12", "train.micro_batch_size=2", nnodes=3)  # dp 6
    # dp 4: 12 / 4 = 3 samples per rank, which micro-batches of 2 do not divide.
    assert replan(full, 2) == StartShape(2, {"cluster.nnodes": 2, "parallel.dp": 4, "train.micro_batch_size": 3},
                                         "same tp x pp")
    assert replan(full, 1) == StartShape(1, {"cluster.nnodes": 1, "parallel.dp": 2}, "same tp x pp")
    assert accumulation(with_overrides(full, replan(full, 1).overrides)) == 3


def test_tp2_x_pp2_on_two_nodes_of_two_is_replanned_on_one():
    full = cfg("parallel.tp=2", "parallel.pp=2", *H100)
    assert full.parallel.dp == 1
    assert same_layout(full, 1) is None  # 2 ranks: tp x pp = 4 no longer fits
    assert replan(full, 1) == StartShape(1, {"cluster.nnodes": 1, "parallel.dp": 2, "parallel.tp": 1,
                                             "parallel.pp": 1, "parallel.zero": 2, "train.micro_batch_size": 1},
                                         "re-planned")


def test_a_hybrid_shard_that_no_longer_divides_dp_shards_over_all_of_it():
    hybrid = cfg("parallel.zero=3", "parallel.dp_shard=4")  # dp 4, one shard group of 4
    assert replan(hybrid, 1) == StartShape(1, {"cluster.nnodes": 1, "parallel.dp": 2, "parallel.dp_shard": None},
                                           "same tp x pp")
    # A shard group of 2 divides dp 4 as it divided dp 8: kept.
    kept = cfg("parallel.zero=3", "parallel.dp_shard=2", per_node=4)
    assert replan(kept, 1) == StartShape(1, {"cluster.nnodes": 1, "parallel.dp": 4}, "same tp x pp")


def test_expert_parallel_is_kept_while_it_divides_dp_else_replanned():
    kept = cfg("model=moe-tiny", "parallel.ep=2", *H100)
    assert replan(kept, 1) == StartShape(1, {"cluster.nnodes": 1, "parallel.dp": 2}, "same tp x pp")
    assert shape_line(kept, replan(kept, 1)) == (
        "llmtrain: this start has 1 of 2 nodes: same tp x pp, dp=4 tp=1 pp=1 ep=2 -> dp=2 tp=1 pp=1 ep=2, "
        "micro-batches per rank 1 -> 2, global batch 16 kept")
    # ep 4 cannot divide dp 2: plan --suggest's search.
    replanned = cfg("model=moe-tiny", "parallel.ep=4", *H100)
    assert replan(replanned, 1) == StartShape(1, {"cluster.nnodes": 1, "parallel.dp": 2, "parallel.ep": 1,
                                                  "parallel.zero": 2, "train.micro_batch_size": 1}, "re-planned")


def test_a_layout_over_the_plans_memory_on_fewer_nodes_is_replanned():
    # gpt-1.3b, ZeRO-3 over dp 4 on 24 GiB A10s: fits; the same layout over dp 2 does not.
    full = cfg("model=gpt-1.3b", "hardware=a10", "precision=bf16", "parallel.zero=3", "train.loss=full")
    assert _peak_fits(full) and not _peak_fits(same_layout(full, 1))
    assert replan(full, 1) == StartShape(1, {"cluster.nnodes": 1, "parallel.dp": 2, "parallel.zero": 2,
                                             "train.micro_batch_size": 1}, "re-planned")
    assert _peak_fits(with_overrides(full, replan(full, 1).overrides))


def test_nothing_that_fits_on_fewer_nodes_is_one_line_naming_min_nnodes():
    # gpt-13b over 16 A10s fits with ZeRO-3 and full recompute; over 8 no layout does.
    big = cfg("model=gpt-13b", "hardware=a10", "precision=bf16", "parallel.zero=3", "recompute.mode=full",
              per_node=8)
    assert _peak_fits(big)
    with pytest.raises(ConfigError) as e:
        replan(big, 1)
    assert f"{e.value.key}: {e.value.message}" == NOTHING_FITS
    with pytest.raises(ConfigError) as e:  # refused before launch, with the same words
        check_shapes(big)
    assert f"{e.value.key}: {e.value.message}" == NOTHING_FITS


# ------------------------------------------------------------------------------------------ before launch
def test_check_shapes_plans_every_node_count_the_run_accepts():
    full = cfg("train.global_batch_size=12", "train.micro_batch_size=2", nnodes=3)
    assert check_shapes(full) == {1: replan(full, 1), 2: replan(full, 2)}
    assert (min_nnodes(full), elastic(full)) == (1, True)
    for same in (cfg(fewest=None), cfg(fewest=2)):  # null = cluster.nnodes: nothing to plan
        assert (min_nnodes(same), elastic(same), check_shapes(same)) == (2, False, {})


def test_check_shapes_plans_ssh_which_starts_on_the_hosts_that_answer(tmp_path):
    hostfile = tmp_path / "hosts"
    hostfile.write_text("h1 slots=2\nh2 slots=2\nh3 slots=2\n")
    ssh = compose_here(["cluster=ssh", "device=cpu", "cluster.nnodes=3", "cluster.nproc_per_node=2",
                        "cluster.min_nnodes=2", f"cluster.hostfile={hostfile}", "train.global_batch_size=12"])
    validate_here(ssh)
    assert check_shapes(ssh) == {2: StartShape(2, {"cluster.nnodes": 2, "parallel.dp": 4,
                                                   "train.micro_batch_size": 3}, "same tp x pp")}


def test_cluster_local_with_fewer_nodes_is_refused_naming_min_nnodes():
    local = compose_here(["cluster=local", "device=cpu", "cluster.nnodes=2", "cluster.nproc_per_node=2",
                          "cluster.min_nnodes=1"])
    validate_here(local)
    with pytest.raises(ConfigError) as e:
        check_shapes(local)
    assert f"{e.value.key}: {e.value.message}" == (
        "cluster.min_nnodes: cluster=local starts exactly the nodes it is given; a run that goes on with fewer "
        "nodes needs cluster=slurm or cluster=ssh (or leave cluster.min_nnodes null)")
    local.cluster.min_nnodes = 2
    assert check_shapes(local) == {}


def test_min_nnodes_out_of_range_is_one_line_naming_the_key():
    for bad in (0, 3):
        with pytest.raises(ConfigError) as e:
            cfg(fewest=bad)
        assert f"{e.value.key}: {e.value.message}" == (
            f"cluster.min_nnodes: must be in [1, cluster.nnodes=2], or null for cluster.nnodes (got {bad})")


# ------------------------------------------------------------------------------- the start's record and line
def test_config_for_start_applies_the_recorded_shape_only_when_the_world_size_matches():
    full = cfg()
    shape = replan(full, 1)
    entry = {SHAPE: shape.to_record()}
    assert config_for_start(full, entry, 4) is full  # the ranks the config asks for: as it is
    one = config_for_start(full, entry, 2)
    assert (one.cluster.nnodes, one.parallel.dp, one.train.global_batch_size) == (1, 2, 16)
    assert full.parallel.dp == 4  # the run's config is not changed
    for world, recorded in ((3, entry), (2, {})):
        with pytest.raises(ConfigError) as e:
            config_for_start(full, recorded, world)
        assert f"{e.value.key}: {e.value.message}" == (
            f"cluster.nnodes: {world} ranks started, but the config asks for 2 x 2 and no start of this launch "
            "recorded a layout for that many")


def test_record_facts_keeps_every_start_oldest_first():
    full = cfg()
    first = record_facts(full, replan(full, 2), ["node1", "node2"], {})
    entry = dict(first)
    second = record_facts(full, replan(full, 1), ["node1"], entry)
    assert second[SHAPE] == {"nnodes": 1, "overrides": {"cluster.nnodes": 1, "parallel.dp": 2},
                             "how": "same tp x pp"}
    assert [{k: s[k] for k in ("nnodes", "of", "hosts", "layout", "how")} for s in second[STARTS]] == [
        {"nnodes": 2, "of": 2, "hosts": ["node1", "node2"], "layout": "dp=4 tp=1 pp=1", "how": "as configured"},
        {"nnodes": 1, "of": 2, "hosts": ["node1"], "layout": "dp=2 tp=1 pp=1", "how": "same tp x pp"}]


def test_the_start_line_says_the_nodes_what_is_missing_and_what_changed():
    # The measured two-node job: one process per node, global batch 8 of micro-batches of 2.
    job = cfg("train.global_batch_size=8", "train.micro_batch_size=2", per_node=1)
    why = "not in this start: node2: down, not responding (Not responding)"
    assert shape_line(job, replan(job, 1), ["node1"], why) == (
        "llmtrain: this start has 1 of 2 nodes (node1); not in this start: node2: down, not responding (Not "
        "responding): same tp x pp, dp=2 tp=1 pp=1 -> dp=1 tp=1 pp=1, micro-batches per rank 2 -> 4, global batch 8 "
        "kept")
    # Back on every node: the config's layout.
    assert shape_line(job, replan(job, 2), ["node1", "node2"]) == (
        "llmtrain: this start has 2 of 2 nodes (node1, node2): as configured, dp=2 tp=1 pp=1 -> dp=2 tp=1 pp=1, "
        "micro-batches per rank 2 -> 2, global batch 8 kept")


# ------------------------------------------------------------------------------------------ the sbatch script
@pytest.mark.parametrize("fewest", ["null", "2"])
def test_a_run_that_accepts_no_fewer_nodes_has_the_same_script_byte_for_byte(fake, fewest):
    fake()
    plain = SlurmBackend(slurm_cfg(), "/tmp/r").script()
    assert SlurmBackend(slurm_cfg(f"cluster.min_nnodes={fewest}"), "/tmp/r").script() == plain
    assert "\n#SBATCH --nodes=2\n" in plain and "--no-kill" not in plain and "SLURM_NNODES" not in plain


def test_a_run_that_accepts_fewer_nodes_asks_for_a_range_and_starts_on_what_it_got(fake):
    fake()
    script = SlurmBackend(slurm_cfg("cluster.min_nnodes=1"), "/tmp/r").script()
    assert "\n#SBATCH --nodes=1-2\n#SBATCH --no-kill\n" in script, script
    [srun] = [line for line in script.splitlines() if line.startswith("srun ")]
    assert srun.startswith('srun "--nodes=${SLURM_NNODES}" --ntasks-per-node=1 '), srun
    assert ' "--nnodes=${SLURM_NNODES}" --nproc-per-node=1 ' in srun, srun
    assert "--nodes=2" not in script and "--nnodes=2" not in script
