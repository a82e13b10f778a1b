"""Starting the job: one launcher interface, one small backend per way of reaching the nodes."""

from llmtrain.launch.backend import Backend, NodeCommand, get_backend

__all__ = ["Backend", "NodeCommand", "get_backend"]
