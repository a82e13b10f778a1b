"""Using a trained checkpoint in one process: `llmtrain generate` (text from a prompt) and `llmtrain eval` (loss
and perplexity on token data). Weights come consolidated from any parallel layout (checkpoint.export), the model
is the family its config.yaml names (model.build_model), and text goes through the tokenizer the run's data was
prepared with (data's FILE.json). The argument modules (`*_cli.py`) import no torch, so `--help` stays fast."""
