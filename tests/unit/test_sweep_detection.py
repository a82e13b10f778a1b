"""A launch override that Hydra's multirun reads as several values is refused, naming the key and -m."""

import pytest

from llmtrain.config.compose import _is_sweep, check_override_habits
from llmtrain.config.errors import ConfigError


@pytest.mark.parametrize("override", ["train.lr=1e-3,3e-4", "train.seed=range(0,3)", "train.seed=choice(1,2)",
                                      "model=glob(gpt-*)", "train.lr=interval(0,1)", "+env.A=x,y"])
def test_several_values_are_a_sweep(override):
    assert _is_sweep(override)


@pytest.mark.parametrize("override", ["train.lr=1e-3", "run.dir='a,b'", 'run.dir="a,b"', r"run.dir=a\,b",
                                      "+env.LIST=[1,2]", "+env.MAP={a:1,b:2}", "~train.seed", "run.dir=range"])
def test_one_value_is_not(override):
    assert not _is_sweep(override)


def test_a_sweep_at_launch_names_the_key_and_the_way_to_sweep():
    with pytest.raises(ConfigError) as e:
        check_override_habits(["train.lr=1e-3,3e-4"], groups=set())
    assert e.value.key == "train.lr"
    assert "use -m to sweep (llmtrain launch -m ...)" in e.value.message
