"""Training tasks: the interface a plug-in implements, sharding helpers and the built-in tasks."""

from node.tasks.base import Shard, Task, TaskFactory, evaluate, load_task

__all__ = ["Shard", "Task", "TaskFactory", "evaluate", "load_task"]
