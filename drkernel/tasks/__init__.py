"""KernelBench tasks and candidate kernels: loading, structural checks, selection and pairing.

Nothing here imports torch or runs task code, so listing and checking thousands of tasks stays cheap and safe.
"""

from drkernel.tasks.candidates import Candidate, load_candidates, pair_candidates
from drkernel.tasks.loaders import (
    DEFAULT_HUB_DATASET,
    load_hub,
    load_jsonl,
    load_parquet,
    load_task_dir,
    load_task_file,
    load_tasks,
)
from drkernel.tasks.task import Task, TaskLoadError, TaskSelectionError, select_tasks

__all__ = [
    "DEFAULT_HUB_DATASET",
    "Candidate",
    "Task",
    "TaskLoadError",
    "TaskSelectionError",
    "load_candidates",
    "load_hub",
    "load_jsonl",
    "load_parquet",
    "load_task_dir",
    "load_task_file",
    "load_tasks",
    "pair_candidates",
    "select_tasks",
]
