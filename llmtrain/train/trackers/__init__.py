"""Experiment trackers (Weights & Biases, MLflow): every metrics row rank 0 writes also reaches the enabled ones.

One module per tracker, each a `Tracker` (base.py); `fanout.open_trackers` starts the enabled ones and keeps a
failing one from stopping training; `run_ids` keeps their run ids in RUN_DIR/trackers.json so a resumed run
continues the same tracker runs; `requirements` tells, without importing them, whether their packages are here.
"""
