"""JSON Lines input of `llmtrain data prepare`: one document per line, the --text-key field of a JSON object."""

from __future__ import annotations

import json
from typing import BinaryIO, Iterator

from .bad_lines import BadLines
from .text_input import NotText, decode_line, is_compressed

TEXT_KEY_FLAG = "--text-key"


def jsonl_documents(src: BinaryIO, name: str, key: str, bad: BadLines, encoding: str = "utf-8",
                    first_line: int = 1) -> Iterator[str]:
    """The `key` string of each line's JSON object (blank lines skipped); `src`'s first line is the file's line
    `first_line`. Raises NotText for a file that is not text; a malformed line (not JSON, not an object, no `key`,
    a value that is not a string) goes to `bad`."""
    for lineno, raw in enumerate(src, first_line):
        if lineno == 1 and is_compressed(raw):
            raise NotText("compressed")
        line = decode_line(raw, encoding)
        if not line.strip():
            continue
        text = _line_text(line, key, f"{name}:{lineno}", bad)
        if text is not None:
            yield text


def _line_text(line: str, key: str, where: str, bad: BadLines) -> str | None:
    try:
        obj = json.loads(line)
    except ValueError as e:
        return bad.found("--input", where, f"not valid JSON: {_json_error(e)}")
    if not isinstance(obj, dict):
        return bad.found("--input", where, f"expected a JSON object, got {type(obj).__name__}")
    if key not in obj:
        fields = ", ".join(map(repr, list(obj)[:5])) or "no fields"
        return bad.found(TEXT_KEY_FLAG, where, f"no {key!r} field; the line has {fields}")
    text = obj[key]
    if not isinstance(text, str):
        what = "null" if text is None else type(text).__name__
        return bad.found(TEXT_KEY_FLAG, where, f"field {key!r} is {what}, not a string")
    return text


def _json_error(e: ValueError) -> str:
    """The parser's whole message, its position as the column of the line (the line is in FILE:LINE)."""
    if isinstance(e, json.JSONDecodeError):
        return f"{e.msg.removesuffix(' at')} at column {e.colno}"
    return str(e)
