"""Watching a launched job until it ends: the launcher's monitor and progress display, the process trees it owns
and how they are stopped, rank restarts, the ranks' status and place files, the failure analysis that names the
rank that failed first, and the combined log. The lowest room of the launcher: nothing here imports backends/,
node/ or run.py.
"""
