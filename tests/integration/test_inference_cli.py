"""`llmtrain generate` and `llmtrain eval` on checkpoints: greedy ids equal to transformers' greedy `generate` of the
exported model (GPT-2 and Llama), eval's loss equal to the trainer's val_loss at the step it checkpointed (a
mixture under dp=2, a token file under pp=2) and to a direct computation on a token file, and the refusals."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from conftest import SMALL
from helpers.inprocess_run import train_in_process
from helpers.random_checkpoint import save_random_checkpoint
from helpers.token_shards import write_shards, write_tokens

from llmtrain.checkpoint.export import export_checkpoint
from llmtrain.cli import main
from llmtrain.config import compose_config

GPT2 = ["model.n_layers=2", "model.d_model=32", "model.n_heads=2", "model.seq_len=32"]
LLAMA = ["model=llama-tiny", "model.n_layers=2", "model.d_model=64", "model.n_heads=4", "model.n_kv_heads=2",
         "model.seq_len=64", "model.ffn_dim=96", "model.rope_theta=500000", "model.tie_embeddings=false"]
PROMPT = "def f(x):"


def make_checkpoint(path: Path, *overrides: str):
    """A DCP checkpoint of a random model (every parameter moved off its init, so a mis-mapped tensor shows) as the
    trainer saves one: "model" tensors, config.yaml, meta.json."""
    return save_random_checkpoint(path, compose_config(list(overrides)), step=7, matrix_std=0.3)


def cli(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp("inference")
    return {"gpt2": (root / "gpt2" / "checkpoints" / "step-0000007", *make_checkpoint(
                root / "gpt2" / "checkpoints" / "step-0000007", *GPT2)),
            "llama": (root / "llama", *make_checkpoint(root / "llama", *LLAMA)),
            "gpt2-250": (root / "v250", *make_checkpoint(root / "v250", *GPT2, "model.vocab_size=250"))}


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_greedy_ids_equal_transformers_greedy_generate(family, checkpoints, tmp_path, capsys):
    transformers = pytest.importorskip("transformers", reason="transformers not installed: pip install transformers")
    path, model, cfg = checkpoints[family]
    code, out, err = cli(capsys, "generate", str(path), "--prompt", PROMPT, "--tokenizer", "byte", "--temperature",
                         "0", "--max-new-tokens", "20", "--device", "cpu", "--json")
    assert code == 0, err
    ours = json.loads(out)
    assert ours["prompt_ids"] == list(PROMPT.encode()) and ours["stopped"] == "max_new_tokens"
    assert len(ours["ids"]) == 20 and len(set(ours["ids"])) > 3  # not one token over and over

    export_checkpoint(path, "hf", tmp_path / "hf")
    auto = transformers.GPT2LMHeadModel if family == "gpt2" else transformers.LlamaForCausalLM
    hf = auto.from_pretrained(str(tmp_path / "hf"), local_files_only=True).eval()
    hf.generation_config.eos_token_id = None  # run the 20 tokens, as --max-new-tokens does here
    hf.generation_config.pad_token_id = 0
    prompt = torch.tensor([ours["prompt_ids"]])
    with torch.no_grad():
        theirs = hf.generate(prompt, attention_mask=torch.ones_like(prompt), do_sample=False, max_new_tokens=20)
    assert theirs[0, len(PROMPT):].tolist() == ours["ids"]


def test_generation_past_the_context_recomputes_the_last_seq_len_tokens(checkpoints, capsys):
    path, model, cfg = checkpoints["gpt2"]
    code, out, err = cli(capsys, "generate", str(path), "--prompt", PROMPT, "--tokenizer", "byte", "--temperature",
                         "0", "--max-new-tokens", "40", "--device", "cpu", "--json")
    assert code == 0, err
    ids = list(PROMPT.encode())
    with torch.no_grad():
        for _ in range(40):
            ids.append(int(model(torch.tensor([ids[-32:]]))[0, -1, :256].argmax()))
    assert json.loads(out)["ids"] == ids[len(PROMPT):]


def test_a_run_directory_of_stdlib_data_needs_no_other_flag(checkpoints, capsys):
    """`llmtrain generate RUN_DIR --prompt "def "`: its newest checkpoint, byte-level, sampled with seed 0."""
    path, model, cfg = checkpoints["gpt2"]
    run_dir = path.parent.parent
    code, out, err = cli(capsys, "generate", str(run_dir), "--prompt", "def ")
    assert code == 0, err
    lines = err.splitlines()
    assert lines[0] == (f"llmtrain: generating from {path} (newest complete checkpoint of {run_dir}), step 7, on "
                        f"{'cuda' if torch.cuda.is_available() else 'cpu'}; tokenizer byte-level, as data=stdlib")
    assert lines[1].startswith("llmtrain: 200 new tokens in ") and lines[1].endswith(
        "stopped after --max-new-tokens 200")
    runs = [json.loads(cli(capsys, "generate", str(run_dir), "--prompt", "def ", "--json", *seed)[1])
            for seed in ([], [], ["--seed", "1"])]
    assert runs[0]["ids"] == runs[1]["ids"] != runs[2]["ids"]
    assert out == "def " + runs[0]["text"] + "\n"


@pytest.mark.parametrize("argv, line", [
    (["generate", "{tmp}/nothing", "--prompt", "x"], "llmtrain: error: {tmp}/nothing: no such checkpoint folder or "
                                                     "run directory"),
    (["eval", "{tmp}/nothing"], "llmtrain: error: {tmp}/nothing: no such checkpoint folder or run directory"),
    (["generate", "{tmp}", "--prompt", "x"], "llmtrain: error: {tmp}: run directory without a complete checkpoint "
                                             "({tmp}/checkpoints does not exist, and {tmp} is not a checkpoint folder "
                                             "either)"),
    (["generate", "{gpt2}", "--prompt", "x" * 33, "--tokenizer", "byte"],
     "llmtrain: error: --prompt: is 33 tokens, longer than the model's context of 32 (model.seq_len)"),
    (["generate", "{gpt2}", "--prompt", ""], "llmtrain: error: --prompt: is empty: give at least one token of text "
                                             "to continue"),
    (["generate", "{v250}", "--prompt", "x"],
     "llmtrain: error: --tokenizer: byte-level, as data=stdlib has 256 tokens but the model's vocabulary is 250 "
     "(model.vocab_size); give --tokenizer the tokenizer.json the run's data was prepared with"),
    (["generate", "{gpt2}", "--prompt", "x", "--top-p", "0"], "llmtrain: error: --top-p: must be in (0, 1], got 0.0"),
    (["generate", "{gpt2}", "--prompt", "x", "--device", "tpu"],
     "llmtrain: error: --device: unknown device 'tpu' (cpu, cuda, cuda:N)"),
    (["eval", "{gpt2}", "--data", "{tmp}/short.bin"],
     "llmtrain: error: --data: {tmp}/short.bin holds 32 tokens, fewer than one window of 33 (model.seq_len + 1)"),
    (["eval", "{gpt2}", "--data", "{tmp}/missing.bin"], "llmtrain: error: --data: no such file: {tmp}/missing.bin"),
    (["eval", "{gpt2}", "--batches", "0"], "llmtrain: error: --batches: must be >= 1, got 0"),
])
def test_bad_input_is_one_line_and_exit_2(argv, line, checkpoints, tmp_path, capsys):
    write_tokens(tmp_path / "short.bin", np.arange(32))
    names = {"tmp": tmp_path, "gpt2": checkpoints["gpt2"][0], "v250": checkpoints["gpt2-250"][0]}
    code, out, err = cli(capsys, *[a.format(**names) for a in argv])
    assert (code, out, err) == (2, "", line.format(**names) + "\n")


def test_the_data_tokenizer_is_found_and_generation_stops_at_its_end_of_text(tmp_path, capsys):
    """A run on data prepared with a tokenizer.json of 7 tokens and a model of 64: that tokenizer, found from the
    data's FILE.json, only ids it has, and a stop after <|endoftext|>."""
    tokenizers = pytest.importorskip("tokenizers", reason="tokenizers not installed: pip install tokenizers")
    from llmtrain.data import prepare_corpus

    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel(unk_token="[UNK]"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    tok.train_from_iterator(["the cat sat on the mat"],
                            tokenizers.trainers.WordLevelTrainer(special_tokens=["[UNK]", "<|endoftext|>"]))
    tok.save(str(tmp_path / "tokenizer.json"))
    (tmp_path / "docs.txt").write_text("the cat sat on the mat")
    prepare_corpus([str(tmp_path / "docs.txt")], str(tmp_path / "words.bin"),
                   tokenizer=str(tmp_path / "tokenizer.json"))
    make_checkpoint(tmp_path / "ck", *GPT2, "data=memmap", f"data.path={tmp_path / 'words.bin'}", "model.vocab_size=64")
    eot, runs = tok.token_to_id("<|endoftext|>"), []
    for seed in range(5):
        code, out, err = cli(capsys, "generate", str(tmp_path / "ck"), "--prompt", "the cat", "--seed", str(seed),
                             "--max-new-tokens", "60", "--json")
        assert code == 0, err
        runs.append(json.loads(out))
    assert runs[0]["tokenizer"] == f"{tmp_path / 'tokenizer.json'} (from {tmp_path / 'words.bin.json'})"
    for run in runs:
        assert run["prompt_ids"] == tok.encode("the cat").ids and max(run["ids"]) < tok.get_vocab_size()
        assert (run["stopped"] == "eot") == (run["ids"][-1] == eot) and eot not in run["ids"][:-1]
        text_ids = run["ids"][:-1] if run["stopped"] == "eot" else run["ids"]
        assert run["text"] == tok.decode(text_ids)
    assert {run["stopped"] for run in runs} == {"eot", "max_new_tokens"}, [len(run["ids"]) for run in runs]


def test_cuda_refused_without_cuda(checkpoints, capsys):
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    code, out, err = cli(capsys, "generate", str(checkpoints["gpt2"][0]), "--prompt", "x", "--device", "cuda")
    assert (code, err) == (2, "llmtrain: error: --device: cuda: CUDA is not available on this machine\n")


def test_eval_of_token_files_is_the_mean_loss_of_every_window(checkpoints, tmp_path, capsys):
    path, model, cfg = checkpoints["llama"]
    rng = np.random.default_rng(1)
    a = write_tokens(tmp_path / "a.bin", rng.integers(0, 256, 64 * 5 + 10))  # 5 windows of 65
    b = write_shards(tmp_path / "b", [rng.integers(0, 256, 100), rng.integers(0, 256, 100)])  # 3, across shards
    code, out, err = cli(capsys, "eval", str(path), "--data", a, "--data", b, "--batch-size", "2", "--json")
    assert code == 0, err
    got = json.loads(out)

    def direct(tokens: np.ndarray, windows: int) -> torch.Tensor:
        rows = torch.stack([torch.from_numpy(tokens[k * 64: k * 64 + 65].astype(np.int64)) for k in range(windows)])
        with torch.no_grad():
            return F.cross_entropy(model(rows[:, :-1]).flatten(0, 1), rows[:, 1:].flatten(), reduction="none")

    tokens_b = np.concatenate([np.fromfile(f, dtype=np.uint16) for f in sorted(Path(b).glob("shard-*.bin"))])
    la, lb = direct(np.fromfile(a, dtype=np.uint16), 5), direct(tokens_b, 3)
    assert got["sources"]["a"]["windows"] == 5 and got["sources"]["b"]["windows"] == 3
    assert got["sources"]["a"]["tokens"] == 5 * 64 and got["tokens"] == 8 * 64
    assert got["sources"]["a"]["loss"] == pytest.approx(float(la.mean()), abs=1e-5)
    assert got["sources"]["b"]["loss"] == pytest.approx(float(lb.mean()), abs=1e-5)
    assert got["loss"] == pytest.approx(float(torch.cat([la, lb]).mean()), abs=1e-5)
    assert got["perplexity"] == pytest.approx(float(torch.cat([la, lb]).mean().exp()), rel=1e-5)
    # --batches N: the first N batches only.
    code, out, err = cli(capsys, "eval", str(path), "--data", a, "--batches", "1", "--batch-size", "2", "--json")
    assert json.loads(out)["sources"]["a"]["windows"] == 2
    assert json.loads(out)["loss"] == pytest.approx(float(la[:128].mean()), abs=1e-5)
    # The table.
    code, out, err = cli(capsys, "eval", str(path), "--data", a, "--data", b, "--batch-size", "2")
    assert code == 0 and err.startswith(f"llmtrain: evaluating {path}, step 7, on ")
    assert out.splitlines() == [
        "source   windows  tokens    loss  perplexity",
        f"a              5     320  {got['sources']['a']['loss']:.4f}  {got['sources']['a']['perplexity']:>10.2f}",
        f"b              3     192  {got['sources']['b']['loss']:.4f}  {got['sources']['b']['perplexity']:>10.2f}",
        f"overall              512  {got['loss']:.4f}  {got['perplexity']:>10.2f}"]


# ---- eval against the trainer's own val_loss ---------------------------------------------------------------------


def _eval_json(capsys, run_dir: Path, *extra: str) -> dict:
    code, out, err = cli(capsys, "eval", str(run_dir), "--device", "cpu", "--json", *extra)
    assert code == 0, err
    return json.loads(out)


@pytest.mark.slow
def test_eval_equals_the_trainers_val_loss_of_a_mixture_under_dp2(tmp_path, capsys):
    rng = np.random.default_rng(0)
    web = write_tokens(tmp_path / "web.bin", rng.integers(0, 256, 6000))
    code_src = write_shards(tmp_path / "code", [np.arange(600) % 256, (np.arange(900) * 7) % 256])
    rows = train_in_process(
        tmp_path / "run", *SMALL, "data=mix", f"data.sources=[{{path: {web}, weight: 0.7}}, {{path: {code_src}, "
        "weight: 0.3}]", "train.global_batch_size=8", "train.micro_batch_size=2", "train.eval_interval=3",
        "train.eval_steps=2", "checkpoint.interval=3", "train.max_steps=3", "cluster.nproc_per_node=2")
    (val,) = [r for r in rows if "val_loss" in r]
    assert val["step"] == 3 and (tmp_path / "run" / "checkpoints" / "step-0000003").is_dir()
    got = _eval_json(capsys, tmp_path / "run")
    assert got["step"] == 3 and got["sources"]["web"]["windows"] == 16 and got["sources"]["web"]["weight"] == 0.7
    assert abs(got["loss"] - val["val_loss"]) <= 1e-5
    assert max(abs(got["sources"][k]["loss"] - val["source_val_loss"][k]) for k in ("web", "code")) <= 1e-5
    # Other batches over the same windows: the same loss.
    again = _eval_json(capsys, tmp_path / "run", "--batches", "4", "--batch-size", "4")
    assert abs(again["loss"] - val["val_loss"]) <= 1e-5


@pytest.mark.slow
def test_eval_equals_the_trainers_val_loss_of_a_llama_under_pp2(tmp_path, capsys):
    tokens = write_tokens(tmp_path / "tokens.bin", np.random.default_rng(2).integers(0, 256, 20000))
    rows = train_in_process(
        tmp_path / "run", *SMALL, "model=llama-tiny", "data=memmap", f"data.path={tokens}",
        "train.global_batch_size=8", "train.micro_batch_size=2", "train.eval_interval=2", "train.eval_steps=3",
        "checkpoint.interval=2", "train.max_steps=2", "cluster.nproc_per_node=2", "parallel.pp=2")
    (val,) = [r for r in rows if "val_loss" in r]
    got = _eval_json(capsys, tmp_path / "run")
    assert got["step"] == 2 and got["sources"]["tokens"]["windows"] == 24
    assert abs(got["loss"] - val["val_loss"]) <= 1e-5
