"""Checkpoints: saving and loading training state (DCP), and export to safetensors / Hugging Face GPT-2."""
