"""`llmtrain launch`: run.py checks a composed config, takes the run directory and hands the job to a backend.

Rooms: backends/ (how the nodes are reached: local, ssh, Slurm), node/ (what runs on each node under torchrun),
supervision/ (watching the processes and the run directory until the job ends). docs/launcher.md maps them.
"""
