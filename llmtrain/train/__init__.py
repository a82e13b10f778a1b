"""The training loop that each torchrun worker runs."""
