"""Text to token ids: one token per byte, or a Hugging Face tokenizer.json; tokens are written little-endian."""

from __future__ import annotations

import os
import sys
from array import array
from typing import BinaryIO, Iterable

from .errors import DataError
from .text_input import utf8

EOT_TOKEN = "<|endoftext|>"
# End-of-text tokens looked up, in this order, when --eot-token is not given. Llama 3's <|eot_id|> ends a chat turn,
# not a document: its pretraining end of text is <|end_of_text|>.
EOT_TOKEN_NAMES = (EOT_TOKEN, "<|end_of_text|>", "</s>", "<eos>")
BYTE_VOCAB_SIZE = 256
# Documents per tokenizer batch for .jsonl input (bounded memory, fast batched encoding).
_ENCODE_BATCH_DOCS = 1024
_ENCODE_BATCH_CHARS = 1 << 24


class ByteEncoder:
    """One uint16 token per byte; documents follow each other as is, or each followed by a `separator` byte."""

    def __init__(self, separator: int | None = None):
        self.separator = None if separator is None else bytes_as_uint16(bytes([separator]))

    def write_file(self, chunks: Iterable[bytes], out: BinaryIO) -> int:
        n = 0
        for chunk in chunks:
            out.write(bytes_as_uint16(chunk))
            n += len(chunk)
        return n + self._separate(out)

    def write_documents(self, docs: Iterable[str], out: BinaryIO) -> int:
        if self.separator is None:
            return self.write_file((utf8(doc) for doc in docs), out)
        return sum(self.write_file([utf8(doc)], out) for doc in docs)

    def _separate(self, out: BinaryIO) -> int:
        if self.separator is None:
            return 0
        out.write(self.separator)
        return 1


class TokenizerEncoder:
    """A Hugging Face tokenizer; each document is followed by its end-of-text token (see eot_token_id)."""

    def __init__(self, tok, eot_token: str | None = None):
        self.tok = tok
        self.vocab_size = tok.get_vocab_size(with_added_tokens=True)
        self.dtype = "uint16" if self.vocab_size < 2**16 else "uint32"
        self.typecode = "H" if self.dtype == "uint16" else _uint32_typecode()
        self.eot_id = eot_token_id(tok, eot_token)

    def write_file(self, chunks: Iterable[bytes], out: BinaryIO) -> int:
        # A file is one document, encoded whole (the chunks are valid UTF-8 together).
        return self._write([self.tok.encode(b"".join(chunks).decode("utf-8")).ids], out)

    def write_documents(self, docs: Iterable[str], out: BinaryIO) -> int:
        n, batch, chars = 0, [], 0
        for doc in docs:
            batch.append(doc if doc.isascii() else utf8(doc).decode("utf-8"))
            chars += len(doc)
            if len(batch) >= _ENCODE_BATCH_DOCS or chars >= _ENCODE_BATCH_CHARS:
                n += self._write([e.ids for e in self.tok.encode_batch(batch)], out)
                batch, chars = [], 0
        if batch:
            n += self._write([e.ids for e in self.tok.encode_batch(batch)], out)
        return n

    def _write(self, docs: list[list[int]], out: BinaryIO) -> int:
        tokens = array(self.typecode)
        for ids in docs:
            tokens.extend(ids)
            if self.eot_id is not None:
                tokens.append(self.eot_id)
        if sys.byteorder == "big":
            tokens.byteswap()  # the format is little-endian, like nanoGPT's on x86/ARM
        tokens.tofile(out)
        return len(tokens)


def eot_token_id(tok, eot_token: str | None) -> int | None:
    """The id written after every document: `eot_token`'s, the first of EOT_TOKEN_NAMES the tokenizer has when
    `eot_token` is None, or None (no token) for "none". A one-line DataError naming --eot-token otherwise."""
    if eot_token is not None and eot_token.lower() == "none":
        return None
    names = EOT_TOKEN_NAMES if eot_token is None else (eot_token,)
    for name in names:
        token_id = tok.token_to_id(name)
        if token_id is not None:
            return token_id
    if eot_token is not None:
        raise DataError("--eot-token", f"the tokenizer has no token {eot_token!r}")
    raise DataError("--eot-token", f"the tokenizer has none of {', '.join(EOT_TOKEN_NAMES)}; name its end-of-text "
                                   "token with --eot-token TOKEN, or write none with --eot-token none")


def load_tokenizer(path: str):
    try:
        from tokenizers import Tokenizer  # optional dependency, only for --tokenizer
    except ImportError:
        raise DataError("--tokenizer", "needs the 'tokenizers' package: pip install tokenizers (or llmtrain[data])") from None
    path = os.path.expanduser(os.fspath(path))
    if not os.path.isfile(path):
        raise DataError("--tokenizer", f"no such file: {path}")
    try:
        return Tokenizer.from_file(path)
    except Exception as e:  # tokenizers raises a bare Exception on malformed JSON
        raise DataError("--tokenizer", f"cannot load {path}: {e}") from None


def _uint32_typecode() -> str:
    for code in ("I", "L"):
        if array(code).itemsize == 4:
            return code
    raise RuntimeError("no 4-byte unsigned array typecode on this platform")


def bytes_as_uint16(data: bytes) -> bytearray:
    """Little-endian uint16 per byte: interleave with zero high bytes (a C-speed slice copy)."""
    out = bytearray(2 * len(data))
    out[0::2] = data
    return out
