from llmtrain.cli import entry

entry()
