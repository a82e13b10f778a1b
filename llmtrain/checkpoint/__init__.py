"""Checkpoints: saving and loading training state (DCP), and export to safetensors / a Hugging Face folder."""
