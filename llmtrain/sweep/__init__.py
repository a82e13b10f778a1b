"""`llmtrain launch -m OVERRIDES...`: a sweep over the cartesian product of the swept values, one normal run (its own
run directory and config.yaml) per combination, all under one sweep directory with a sweep.yaml index."""

# The sweep directory's name, exported to every worker of its runs (through the config's env mapping), so a run
# can say which sweep it belongs to (e.g. a tracker's group name).
SWEEP_NAME_VAR = "LLMTRAIN_SWEEP_NAME"
SWEEP_FILE = "sweep.yaml"
