"""llmtrain.inference without a checkpoint: choosing the next token (greedy, temperature, top-k, top-p, seed), the
generation loop (window, end-of-text, padding rows) on a stand-in model, and finding the run's tokenizer."""

from __future__ import annotations

import json
import math

import pytest
import torch

from llmtrain.config import compose_config
from llmtrain.errors import ConfigError
from llmtrain.inference.sampling import EOT, MAX_NEW_TOKENS, SamplingOptions, generate, next_token
from llmtrain.inference.tokenizer import ByteTokenizer, HFTokenizer, run_tokenizer

PROBS = [0.5, 0.3, 0.15, 0.05]
LOGITS = torch.tensor(PROBS).log() + 3.0  # any offset: softmax gives PROBS back


def draw(options: SamplingOptions, n: int = 4000, seed: int = 0) -> list[float]:
    """How often each token is drawn in n draws, as fractions."""
    generator = torch.Generator().manual_seed(seed)
    counts = [0] * len(PROBS)
    for _ in range(n):
        counts[next_token(LOGITS, options, generator)] += 1
    return [c / n for c in counts]


def test_temperature_zero_and_top_k_one_are_greedy():
    generator = torch.Generator().manual_seed(0)
    logits = torch.tensor([0.1, 2.0, 1.9, -3.0])
    assert [next_token(logits, SamplingOptions(temperature=0), generator) for _ in range(20)] == [1] * 20
    assert [next_token(logits, SamplingOptions(temperature=5.0, top_k=1), generator) for _ in range(20)] == [1] * 20


def test_sampling_follows_softmax_of_logits_over_temperature():
    got = draw(SamplingOptions(temperature=1.0))
    assert max(abs(g - p) for g, p in zip(got, PROBS)) < 0.03, got
    # T = 0.5 squares the probabilities (renormalised).
    squared = [p * p / sum(q * q for q in PROBS) for p in PROBS]
    got = draw(SamplingOptions(temperature=0.5))
    assert max(abs(g - p) for g, p in zip(got, squared)) < 0.03, got


def test_top_k_and_top_p_keep_only_the_likeliest_tokens():
    got = draw(SamplingOptions(top_k=2))
    assert got[2] == got[3] == 0 and abs(got[0] - 0.5 / 0.8) < 0.03, got
    # Before token 2 the likelier ones hold 0.8 >= 0.7: tokens 2 and 3 are dropped.
    got = draw(SamplingOptions(top_p=0.7))
    assert got[2] == got[3] == 0 and abs(got[0] - 0.5 / 0.8) < 0.03, got
    got = draw(SamplingOptions(top_p=0.85))
    assert got[3] == 0 and got[2] > 0.1, got
    got = draw(SamplingOptions(top_p=0.01))  # the likeliest token always stays
    assert got == [1.0, 0.0, 0.0, 0.0]
    got = draw(SamplingOptions(top_k=3, top_p=0.6))  # both: top-k, then top-p of what is left
    assert got[2] == got[3] == 0, got


def test_a_seed_gives_the_same_draws_and_another_seed_others():
    options = SamplingOptions(temperature=1.0)
    first = [next_token(LOGITS, options, torch.Generator().manual_seed(7)) for _ in range(1)]
    runs = []
    for seed in (7, 7, 8):
        generator = torch.Generator().manual_seed(seed)
        runs.append([next_token(LOGITS, options, generator) for _ in range(50)])
    assert runs[0] == runs[1] != runs[2] and runs[0][:1] == first


@pytest.mark.parametrize("options, line", [
    (SamplingOptions(max_new_tokens=0), "--max-new-tokens: must be >= 1, got 0"),
    (SamplingOptions(temperature=-0.5), "--temperature: must be >= 0 (0: greedy), got -0.5"),
    (SamplingOptions(temperature=math.nan), "--temperature: must be >= 0 (0: greedy), got nan"),
    (SamplingOptions(top_k=0), "--top-k: must be >= 1, got 0"),
    (SamplingOptions(top_p=0.0), "--top-p: must be in (0, 1], got 0.0"),
    (SamplingOptions(top_p=1.5), "--top-p: must be in (0, 1], got 1.5"),
])
def test_bad_sampling_options_are_named(options, line):
    with pytest.raises(ConfigError) as err:
        options.check()
    assert str(err.value) == line and err.value.exit_code == 2


class Counting(torch.nn.Module):
    """Logits that make (last token + 1) % vocab the likeliest real token, with padding rows (ids >= vocab) likelier
    still; records the length of every input it is given."""

    def __init__(self, vocab: int, padded: int):
        super().__init__()
        self.vocab, self.padded, self.lengths = vocab, padded, []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.lengths.append(x.shape[1])
        logits = torch.zeros(*x.shape, self.padded)
        logits[..., self.vocab:] = 100.0
        return logits.scatter(2, ((x + 1) % self.vocab).unsqueeze(-1), 10.0)


def test_generation_runs_over_the_last_seq_len_tokens_and_never_picks_padding():
    model = Counting(vocab=8, padded=16)
    result = generate(model, [3], 8, 4, SamplingOptions(max_new_tokens=10, temperature=0), None, torch.device("cpu"))
    assert result.new_ids == [4, 5, 6, 7, 0, 1, 2, 3, 4, 5] and result.stopped == MAX_NEW_TOKENS
    assert model.lengths == [1, 2, 3, 4, 4, 4, 4, 4, 4, 4]


def test_generation_stops_after_the_end_of_text_token():
    model = Counting(vocab=8, padded=8)
    result = generate(model, [2, 3], 8, 16, SamplingOptions(max_new_tokens=10, temperature=0), 6, torch.device("cpu"))
    assert result.new_ids == [4, 5, 6] and result.stopped == EOT


# ---- which tokenizer ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def word_data(tmp_path_factory):
    """A token file prepared with a word-level tokenizer.json (8 tokens, <|endoftext|> among them)."""
    tokenizers = pytest.importorskip("tokenizers", reason="tokenizers not installed: pip install tokenizers")
    from llmtrain.data import prepare_corpus

    folder = tmp_path_factory.mktemp("words")
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel(unk_token="[UNK]"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    docs = ["the cat sat on the mat", "the dog sat"]
    tok.train_from_iterator(docs, tokenizers.trainers.WordLevelTrainer(special_tokens=["[UNK]", "<|endoftext|>"]))
    tok.save(str(folder / "tokenizer.json"))
    (folder / "docs.txt").write_text(docs[0])
    prepare_corpus([str(folder / "docs.txt")], str(folder / "words.bin"), tokenizer=str(folder / "tokenizer.json"))
    return folder, tok


def test_byte_level_for_stdlib_data():
    tokenizer = run_tokenizer(compose_config([]), {}, None)
    assert isinstance(tokenizer, ByteTokenizer) and tokenizer.origin == "byte-level, as data=stdlib"
    assert tokenizer.encode("dé") == [100, 195, 169] and tokenizer.decode([100, 195, 169]) == "dé"


def test_the_tokenizer_the_data_was_prepared_with(word_data, tmp_path, monkeypatch):
    folder, tok = word_data
    cfg = compose_config(["data=memmap", f"data.path={folder / 'words.bin'}", "model.vocab_size=256"])
    tokenizer = run_tokenizer(cfg, {}, None)
    assert isinstance(tokenizer, HFTokenizer)
    assert tokenizer.origin == f"{folder / 'tokenizer.json'} (from {folder / 'words.bin.json'})"
    assert tokenizer.eot_id == tok.token_to_id("<|endoftext|>") and tokenizer.vocab_size == tok.get_vocab_size()
    assert tokenizer.encode("the cat") == tok.encode("the cat").ids and tokenizer.decode(tok.encode("the cat").ids) \
        == "the cat"
    # Launched from elsewhere (a relative data.path): the checkpoint's recorded absolute path finds the file.
    monkeypatch.chdir(tmp_path)
    moved = compose_config(["data=memmap", "data.path=words.bin", "model.vocab_size=256"])
    with pytest.raises(ConfigError) as err:
        run_tokenizer(moved, {}, None)
    assert str(err.value) == (f"--tokenizer: cannot tell which tokenizer the run's data was prepared with "
                              f"({tmp_path / 'words.bin'} is not there); give --tokenizer tokenizer.json, or "
                              "--tokenizer byte")
    recorded = {"data": {"name": "memmap", "path": str(folder / "words.bin")}}
    assert run_tokenizer(moved, recorded, None).eot_id == tokenizer.eot_id


def test_tokenizers_that_do_not_fit_are_refused_in_one_line(word_data, tmp_path):
    folder, tok = word_data
    n = tok.get_vocab_size()
    cfg = compose_config(["data=memmap", f"data.path={folder / 'words.bin'}", "model.vocab_size=256"])
    with pytest.raises(ConfigError) as err:
        run_tokenizer(cfg, {}, "byte")
    assert str(err.value) == (f"--tokenizer: byte-level has 256 tokens but the run's data was prepared with "
                              f"{folder / 'tokenizer.json'}: {n} tokens ({folder / 'words.bin.json'})")
    small = compose_config(["data=memmap", f"data.path={folder / 'words.bin'}", f"model.vocab_size={n - 1}"])
    with pytest.raises(ConfigError) as err:
        run_tokenizer(small, {}, None)
    assert str(err.value).startswith(f"--tokenizer: {folder / 'tokenizer.json'} (from {folder / 'words.bin.json'}) "
                                     f"has {n} tokens but the model's vocabulary is {n - 1} (model.vocab_size)")
    with pytest.raises(ConfigError, match=r"^--tokenizer: byte-level has 256 tokens but the model's vocabulary is 100"):
        run_tokenizer(compose_config(["model.vocab_size=100"]), {}, "byte")
    with pytest.raises(ConfigError, match="^--tokenizer: the run trained on data=synthetic, which has no tokenizer"):
        run_tokenizer(compose_config(["data=synthetic"]), {}, None)
    # The tokenizer.json the meta names is gone.
    (tmp_path / "w.bin").write_bytes((folder / "words.bin").read_bytes())
    meta = json.loads((folder / "words.bin.json").read_text())
    (tmp_path / "w.bin.json").write_text(json.dumps({**meta, "tokenizer": str(tmp_path / "gone.json")}))
    with pytest.raises(ConfigError) as err:
        run_tokenizer(compose_config(["data=memmap", f"data.path={tmp_path / 'w.bin'}"]), {}, None)
    assert str(err.value) == (f"--tokenizer: the run's data was prepared with {tmp_path / 'gone.json'} "
                              f"({tmp_path / 'w.bin.json'}), which is not there any more; give --tokenizer "
                              "tokenizer.json")
