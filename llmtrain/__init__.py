"""llmtrain: config-driven launcher and hybrid-parallel GPT trainer."""

__version__ = "0.1.0"
