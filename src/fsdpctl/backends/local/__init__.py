"""BACKEND=local: the job on this machine, one torchrun launcher per simulated node."""
