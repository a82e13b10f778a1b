"""`llmtrain tune`: the plan's fastest layouts measured in short trials (a sweep of them), the measured fastest
written as a config to launch with, and the measurements fitted into the plan's step time (plan/calibration.py)."""
