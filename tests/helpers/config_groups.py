"""The built-in config groups and their options, read from the shipped configs folder."""

from llmtrain.config import builtin_config_dir


GROUPS = {d.name: sorted(f.stem for f in d.glob("*.yaml"))
          for d in builtin_config_dir().iterdir() if d.is_dir() and d.name[0] not in "._"}
