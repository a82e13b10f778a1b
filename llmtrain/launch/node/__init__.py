"""What runs on each node, started by a backend: the node agent around torchrun, the network environment it picks,
the cluster.setup lines before it, and the Slurm batch script's steps (taking the run directory's lock when the job
starts, sending its own time-limit notice, requeueing it near the limit). These run as `python -m` programs on the
nodes; they may import supervision/, never backends/ or run.py.
"""
