"""Whether every host of a cluster=ssh hostfile answers over ssh, checked in parallel before any job starts.

Each host gets `ssh -o ConnectTimeout=N HOST true` with the launcher's own ssh options (ssh_base), so a host that
passes here is reached the same way by the launch. BatchMode (in ssh_base) makes a host that would ask for a
password fail at once instead of waiting for a keyboard.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from llmtrain.launch.backends.ssh_options import ssh_base

# ConnectTimeout bounds the TCP connect and the banner; a server that stalls later (authentication, a login shell
# that hangs) is cut off this much after it.
STALL_MARGIN_S = 5.0
# Lines ssh may print on stderr that are not the reason it failed.
NOISE = ("Warning: Permanently added", "Pseudo-terminal will not be allocated")


@dataclass(frozen=True)
class HostCheck:
    host: str
    seconds: float
    error: str | None  # None: the host answered

    def line(self) -> str:
        return f"{self.host}: unreachable after {self.seconds:.1f} s ({self.error})"


def ssh_probe_argv(cluster, host: str, connect_timeout_s: float) -> list[str]:
    return ssh_base(cluster) + ["-o", f"ConnectTimeout={connect_timeout_s:g}", host, "true"]


def why_failed(returncode: int, stderr: str) -> str:
    """ssh's own words for a failed probe: its last line that is not noise."""
    lines = [ln.strip() for ln in stderr.splitlines() if ln.strip() and not ln.strip().startswith(NOISE)]
    if returncode == 255:
        return lines[-1] if lines else "ssh exited with status 255 and no message"
    # ssh connected, but the remote shell could not even run `true` (a broken login profile, a full disk).
    said = f": {lines[-1]}" if lines else ""
    return f"connected, but the remote shell exited with status {returncode}{said}"


def check_host(cluster, host: str, connect_timeout_s: float) -> HostCheck:
    start = time.monotonic()
    limit = connect_timeout_s + STALL_MARGIN_S
    try:
        # A session of its own: on a stall the whole group goes (a ProxyCommand child would keep the pipes open).
        proc = subprocess.Popen(ssh_probe_argv(cluster, host, connect_timeout_s), stdin=subprocess.DEVNULL,
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                                start_new_session=True)
    except OSError as e:
        return HostCheck(host, time.monotonic() - start, f"cannot run ssh: {e.strerror or e}")
    try:
        _, stderr = proc.communicate(timeout=limit)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        return HostCheck(host, time.monotonic() - start, f"no answer within {limit:g} s; ssh was stopped")
    seconds = time.monotonic() - start
    return HostCheck(host, seconds, None if proc.returncode == 0 else why_failed(proc.returncode, stderr))


def check_hosts(cluster, hosts: list[str], connect_timeout_s: float) -> list[HostCheck]:
    """Every host at once (a cluster of down nodes costs one timeout, not one per node), in the given order."""
    with ThreadPoolExecutor(max_workers=min(64, max(1, len(hosts)))) as pool:
        return list(pool.map(lambda h: check_host(cluster, h, connect_timeout_s), hosts))
