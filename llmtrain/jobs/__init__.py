"""The job behind a run directory: the record each launch leaves (RUN_DIR/job.json), and `llmtrain status`,
`llmtrain follow` and `llmtrain cancel`, which read it with the lock, the ranks' status files and Slurm's view.

None of this imports torch: these commands run on a login node, often while the job trains elsewhere.
"""
