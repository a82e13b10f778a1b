"""cluster.setup: the user's shell lines (`module load cuda/12.4`, `source /shared/venv/bin/activate`) that run on a
node before its node agent, as POSIX shell statements for the ssh remote command and the sbatch script.

The lines are shell code on purpose; what is made safe is how they are joined: each runs on its own through
`eval` of its quoted text (a comment or an unbalanced quote stays inside its line), in the node's shell so what it
exports or activates reaches the agent, with stdin closed (under ssh, stdin is the agent's control channel), and
the first line that fails stops the node with a message naming it, as `set -e` would.
"""

from __future__ import annotations

import shlex


def setup_statements(lines) -> list[str]:
    """One shell statement per cluster.setup line, in order."""
    return [_statement(number, line) for number, line in enumerate(lines, 1)]


def _statement(number: int, line: str) -> str:
    said = shlex.quote(f"llmtrain: node set-up failed: cluster.setup line {number} ({line}) exited with status")
    return f"eval {shlex.quote(line)} </dev/null || {{ echo {said} $? >&2; exit 1; }}"
