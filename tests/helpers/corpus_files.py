"""Text folders for `llmtrain data prepare`: random words from a small vocabulary, and what a prepare left behind."""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest


WORDS = ["the", "cat", "sat", "on", "mat", "dog", "log", "and", "a", "wörld"]


def write_corpus(folder: Path, files: int, words: int, seed: int = 0) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)
    for i in range(files):
        text = " ".join(rng.choice(WORDS) for _ in range(words)) + "\n"
        (folder / f"doc{i:03d}.txt").write_text(text, encoding="utf-8")
    return folder


def left_over(folder: Path) -> list[str]:
    return sorted(name for name in os.listdir(folder) if name.startswith("."))


@pytest.fixture
def tokenizer(tmp_path) -> str:
    tokenizers = pytest.importorskip("tokenizers")
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel(unk_token="[UNK]"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    tok.train_from_iterator([" ".join(WORDS)], tokenizers.trainers.WordLevelTrainer(
        special_tokens=["[UNK]", "<|endoftext|>"]))
    path = tmp_path / "tokenizer.json"
    tok.save(str(path))
    return str(path)
