"""A run on fewer nodes than it asked for (cluster.min_nnodes): the layout re-planned for the nodes a start has
(replan.py), checked before launch for every node count the run accepts (check.py), recorded per start in
RUN_DIR/job.json and applied by every worker (start_record.py)."""
