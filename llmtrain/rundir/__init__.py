"""A run directory's on-disk contract, read and written through one place: every path of its layout (paths), files
replaced whole (atomic), the ranks' status and place files (rank_files), job.json (job_record) and metrics.jsonl
(metrics_file), and what a full disk still needs: room kept aside (space_reserve) and a warning for a record that
could not be written (unwritten). It imports only the ground floor, so every layer above can ask it."""
