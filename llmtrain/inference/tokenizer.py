"""Text <-> token ids for generate: byte-level (one id per UTF-8 byte, how `llmtrain data prepare` and the stdlib
corpus tokenize by default) or a Hugging Face tokenizer.json, found from the run's data when it can be."""

from __future__ import annotations

import os

from llmtrain.data.encoders import BYTE_VOCAB_SIZE, eot_token_id, load_tokenizer
from llmtrain.errors import ConfigError, DataError
from llmtrain.inference.run_data import data_sources, meta_file, source_meta

BYTE = "byte"  # how a token file's meta names byte-level tokens, and the --tokenizer value that asks for them


class ByteTokenizer:
    vocab_size = BYTE_VOCAB_SIZE
    eot_id = None  # byte-level data has no end-of-text token

    def __init__(self, origin: str = BYTE):
        self.origin = origin  # how it was chosen, in words

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids: list[int]) -> str:
        return bytes(ids).decode("utf-8", errors="replace")


class HFTokenizer:
    """A tokenizer.json; its end-of-text token is the one `data prepare` wrote after each document."""

    def __init__(self, path: str, origin: str, eot_token: str | None = None):
        self.tok = load_tokenizer(path)  # a DataError naming --tokenizer for a missing or malformed file
        self.origin = origin
        self.vocab_size = self.tok.get_vocab_size(with_added_tokens=True)
        try:
            self.eot_id = eot_token_id(self.tok, eot_token)
        except DataError:
            self.eot_id = None  # no end-of-text token: generation runs to --max-new-tokens

    def encode(self, text: str) -> list[int]:
        return self.tok.encode(text).ids

    def decode(self, ids: list[int]) -> str:
        return self.tok.decode(ids)


def run_tokenizer(cfg, ckpt_meta: dict, override: str | None):
    """The tokenizer to generate with: `override` (--tokenizer: a tokenizer.json, or "byte"), else the one the
    run's data was prepared with. Refused in one line (exit 2) when none can be found, or when it does not fit
    the model's vocabulary or the data's."""
    recorded = _recorded_tokenizers(cfg, ckpt_meta)  # {tokenizer: (meta file, data vocab_size, eot token)}
    if override is not None:
        tokenizer = ByteTokenizer("byte-level") if override == BYTE else \
            HFTokenizer(override, override, _eot_of(recorded))
        for what, (where, vocab, _) in recorded.items():
            if vocab is not None and vocab != tokenizer.vocab_size:
                named = "byte-level tokens" if what == BYTE else what
                raise ConfigError("--tokenizer", f"{tokenizer.origin} has {tokenizer.vocab_size:,} tokens but the "
                                                 f"run's data was prepared with {named}: {vocab:,} tokens ({where})")
    else:
        tokenizer = _from_data(cfg, ckpt_meta, recorded)
    model_vocab = int(cfg.model.vocab_size)
    if tokenizer.vocab_size > model_vocab:
        raise ConfigError("--tokenizer", f"{tokenizer.origin} has {tokenizer.vocab_size:,} tokens but the model's "
                                         f"vocabulary is {model_vocab:,} (model.vocab_size); give --tokenizer the "
                                         "tokenizer.json the run's data was prepared with")
    return tokenizer


def _from_data(cfg, ckpt_meta: dict, recorded: dict):
    if cfg.data.name == "stdlib":
        return ByteTokenizer("byte-level, as data=stdlib")
    if cfg.data.name == "synthetic":
        raise ConfigError("--tokenizer", "the run trained on data=synthetic, which has no tokenizer; give "
                                         "--tokenizer tokenizer.json, or --tokenizer byte")
    if not recorded:
        missing = [path for path in data_sources(cfg, ckpt_meta).values() if not os.path.exists(path)]
        why = f"{missing[0]} is not there" if missing else "its token files have no meta naming one"
        raise ConfigError("--tokenizer", f"cannot tell which tokenizer the run's data was prepared with ({why}); "
                                         "give --tokenizer tokenizer.json, or --tokenizer byte")
    if len(recorded) > 1:
        raise ConfigError("--tokenizer", "the run's sources were prepared with different tokenizers ("
                          + ", ".join(f"{name} in {where}" for name, (where, _, _) in recorded.items())
                          + "); name one with --tokenizer")
    (name, (where, _, eot)), = recorded.items()
    if name == BYTE:
        return ByteTokenizer(f"byte-level, as {where} records")
    if not os.path.isfile(name):
        raise ConfigError("--tokenizer", f"the run's data was prepared with {name} ({where}), which is not there "
                                         "any more; give --tokenizer tokenizer.json")
    return HFTokenizer(name, f"{name} (from {where})", eot)


def _recorded_tokenizers(cfg, ckpt_meta: dict) -> dict[str, tuple[str, int | None, str | None]]:
    """The tokenizer each of the run's token files' meta names: {tokenizer: (meta file, vocab_size, eot token)}.
    Files that are gone or have no meta are left out."""
    found: dict[str, tuple[str, int | None, str | None]] = {}
    for path in data_sources(cfg, ckpt_meta).values():
        try:
            meta = source_meta(path)
        except DataError:
            meta = None
        if meta and isinstance(meta.get("tokenizer"), str):
            eot = meta.get("eot_token") if isinstance(meta.get("eot_token"), str) else None
            found.setdefault(meta["tokenizer"], (meta_file(path), meta.get("vocab_size"), eot))
    return found


def _eot_of(recorded: dict) -> str | None:
    eots = {eot for _, _, eot in recorded.values() if eot}
    return eots.pop() if len(eots) == 1 else None
