"""Pre-launch planning without GPUs: parameters, FLOPs, memory, bubble, communication, step time, layouts."""
