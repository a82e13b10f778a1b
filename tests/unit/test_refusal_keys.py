"""Each rule between keys names the key to fix (in-process: compose, then the key rules, no launcher probes)."""

import pytest

from llmtrain.config.compose import compose_config
from llmtrain.config.errors import ConfigError
from llmtrain.config.validate import validate

CASES = [
    (["parallel.tp=3"], "parallel.tp"),
    (["cluster.nproc_per_node=3", "parallel.tp=2"], "parallel.tp"),
    (["train.micro_batch_size=0"], "train.micro_batch_size"),
    (["train.max_steps=-1"], "train.max_steps"),
    (["train.lr=-1"], "train.lr"),
    (["model.n_heads=5"], "model.d_model"),  # d_model=128 is not divisible by 5 heads
    (["model=llama-tiny", "model.n_kv_heads=3"], "model.n_kv_heads"),
    (["precision=fp16", "precision.compute_dtype=float64"], "precision.compute_dtype"),
    (["cluster.nnodes=0"], "cluster.nnodes"),
    (["checkpoint.keep=0"], "checkpoint.keep"),
    (["train.bogus=1"], "train.bogus"),
    (["train.lr=fast"], "train.lr"),
    (["model=nope"], "model"),
    (["precision=apex-o2"], "precision"),
]


@pytest.mark.parametrize("overrides, key", CASES, ids=[" ".join(o) for o, _ in CASES])
def test_the_refusal_names_the_key(overrides, key):
    with pytest.raises(ConfigError) as e:
        validate(compose_config(overrides))
    assert e.value.key == key, e.value
    assert "\n" not in str(e.value)


def test_the_default_config_passes():
    validate(compose_config([]))
