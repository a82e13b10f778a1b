"""An object store's client failures in one line each, what they mean first, then the client's own words."""

from __future__ import annotations

import contextlib
import errno
import os
import socket

from llmtrain.errors import ObjectStoreError


def describe(e: BaseException) -> str:
    """A store client's failure in one line: what it means, then the client's words."""
    if isinstance(e, ObjectStoreError):  # said in these words already, naming the object
        return str(e)
    text = " ".join(str(e).split())[:300]
    kind = type(e).__name__
    every = f"{kind} {text}".lower()
    if isinstance(e, PermissionError) or "accessdenied" in every or "access denied" in every or "forbidden" in every:
        return f"access denied (check the credentials and the bucket's policy): {text or kind}"
    # s3fs turns SlowDown / 503 into OSError(EBUSY, "Please reduce your request rate.").
    if (isinstance(e, OSError) and e.errno == errno.EBUSY) or "reduce your request rate" in every:
        return f"the store throttles requests (retry later): {text or kind}"
    if "nosuchbucket" in every or "bucket does not exist" in every or "specified bucket does not exist" in every:
        return f"no such bucket: {text or kind}"
    if ("connect" in every or "endpoint" in every or "timeout" in every or "timed out" in every
            or isinstance(e, (ConnectionError, TimeoutError, socket.gaierror))):
        endpoint = os.environ.get("AWS_ENDPOINT_URL", "unset")
        return f"the store's endpoint cannot be reached (AWS_ENDPOINT_URL={endpoint}): {text or kind}"
    if isinstance(e, FileNotFoundError):
        return f"no such bucket or prefix: {text or kind}"
    if "slowdown" in every or "throttl" in every or "503" in every:
        return f"the store throttles requests (retry later): {text or kind}"
    return f"{kind}: {text}"


@contextlib.contextmanager
def answered(location: str):
    """Client failures at `location` as one ObjectStoreError naming it; FileNotFoundError stays itself (callers
    ask whether something is there)."""
    try:
        yield
    except FileNotFoundError:
        raise
    except ObjectStoreError:
        raise
    except Exception as e:
        raise ObjectStoreError(location, describe(e)) from e
