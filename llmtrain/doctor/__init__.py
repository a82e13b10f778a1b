"""`llmtrain doctor`: a preflight of the configured cluster before a long job. command.py runs it; node_availability
checks every node can be used at all before anything starts; rank_probe is what each rank runs (through the same
backend as training), all_reduce_sweeps times its collectives (all-reduce, and all-to-all from all_to_all_sweeps,
both through collective_timing), and findings turns the ranks' report into problems and tables.
"""
