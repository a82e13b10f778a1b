"""Parallelism applied to the model from outside: mesh, data parallel (FSDP2), tensor and pipeline parallel."""
