"""Every error llmtrain reports to a user, and the exit code each one ends the command with.

The ground floor: it imports nothing of llmtrain, so any module may raise these. An error carries its exit code
(`exit_code`); the CLI catches LlmtrainError once and exits with it, so no caller picks a code for an error.
The codes are the table of docs/guarantees.md ("Exit codes").
"""

from __future__ import annotations

import errno

EXIT_OK = 0  # done
EXIT_FAILED = 1  # the job, a check or a comparison failed
EXIT_USAGE = 2  # bad input: one line naming the key or file, before anything starts
EXIT_HANGUP = 129  # SIGHUP (a closed terminal), after the workers checkpointed (128 + SIGHUP)
EXIT_INTERRUPTED = 130  # Ctrl-C (128 + SIGINT)
EXIT_PREEMPTED = 143  # SIGTERM or SIGUSR1, after the workers checkpointed (128 + SIGTERM)


class LlmtrainError(Exception):
    """An error to report in one line (`llmtrain: error: ...`), ending the command with `exit_code`."""

    exit_code = EXIT_FAILED


class KeyedError(LlmtrainError):
    """An error about one thing the user can name: `key` is a config key, a flag or a file; prints `KEY: message`."""

    def __init__(self, key: str, message: str):
        super().__init__(f"{key}: {message}")
        self.key = key
        self.message = message

    def __str__(self) -> str:
        return f"{self.key}: {self.message}"


# ---- bad input (exit 2): refused before anything starts --------------------------------------------------------
class ConfigError(KeyedError):
    """A config key, override, flag or file that breaks a rule."""

    exit_code = EXIT_USAGE


class DataError(KeyedError):
    """A data problem the user can fix; `key` is the config key or flag at fault (e.g. "data.path")."""

    exit_code = EXIT_USAGE


# ---- failures (exit 1) --------------------------------------------------------------------------------------------
class CheckpointError(KeyedError):
    """A checkpoint on disk that cannot be used (missing meta.json, a missing, truncated or altered shard, one DCP
    cannot load); `key` names the folder or file. A failure, not bad input: the config asked for it rightly."""


class CheckpointUsageError(CheckpointError, ConfigError):
    """A checkpoint asked for by a key or flag that cannot be used as given (`checkpoint.resume` naming no
    checkpoint, a model shape that differs from it, `ckpt` arguments): bad input, caught as either parent."""

    exit_code = EXIT_USAGE


class VerifyError(KeyedError):
    """A checkpoint that fails a check of `ckpt verify`: `key` is a file (step-NNNNNNN/name) or a tensor."""


class CancelError(LlmtrainError):
    """The job cannot be stopped from here (another host's launcher, no permission, scancel failed)."""


# ---- the storage (exit 1) ----------------------------------------------------------------------------------------
# The errors that blame the storage rather than the program, in the words a report uses.
STORAGE_ERRNOS = {errno.ENOSPC: "no space left on device", errno.EDQUOT: "disk quota exceeded",
                  errno.EROFS: "read-only file system"}


def storage_reason(err: BaseException) -> str | None:
    """`no space left on device` (or the quota's, or a read-only file system's words) when `err`, or an error it
    was raised from, is an OSError of a full or read-only storage; None otherwise."""
    seen = set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        if isinstance(err, OSError) and err.errno in STORAGE_ERRNOS:
            return STORAGE_ERRNOS[err.errno]
        err = err.__cause__ or err.__context__
    return None


class ObjectStoreError(KeyedError):
    """An object store that did not answer as asked (unreachable, denied, throttled past the client's retries):
    `llmtrain: error: s3://bucket/prefix: access denied (...)`."""


class StorageError(LlmtrainError, OSError):
    """A file that could not be written because the storage is full, over quota or read-only: `no space left on
    device writing PATH`. Still an OSError with the errno, so code that handles a full disk by its errno works."""

    def __init__(self, path: str, err: OSError):
        reason = STORAGE_ERRNOS.get(err.errno, err.strerror or str(err))
        OSError.__init__(self, err.errno, reason, str(path))
        self.path = str(path)
        self.reason = reason

    def __str__(self) -> str:
        return f"{self.reason} writing {self.path}"
