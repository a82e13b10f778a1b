"""How a launch reaches its nodes. base.py is the interface every backend implements (the node commands, the
torchrun line, the workers' environment); traits.py says what each backend is (read elsewhere instead of its
name); registry.py picks the backend cluster.name names; local.py, ssh.py and slurm.py are the three backends, with
what each needs alone (the hostfile's reachability and ssh options for ssh; the batch script's lines, the
partition's nodes and sbatch's refusals for Slurm). Backends may import node/ and supervision/, never run.py. This
file imports nothing: every layer reads traits.py through it.
"""
