"""Slurm, asked from Python: client.py runs every scontrol/scancel/sinfo/sbatch call the package makes (each with a
timeout), show_output.py reads what `scontrol show` prints (its --json form where the installed Slurm has it, the
Key=Value text otherwise), and job_states.py says what a job's state means. It imports nothing of the launcher, so
the launcher, `llmtrain status/cancel/follow` and `llmtrain doctor` all use it.
"""
