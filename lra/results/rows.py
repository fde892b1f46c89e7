"""The order and names of a table's rows and columns, and the words for a cell without a result."""

from __future__ import annotations

from lra.pretraining import SPT_SUFFIX

TASK_ORDER = ["listops", "text", "retrieval", "image", "pathfinder"]
# Rows in the order of the YOSO paper's Table 3, then LRA Table 1's other rows and the learning-to-hash
# table's; unknown labels follow alphabetically.
LABEL_ORDER = ["None", "Softmax", "YOSO-E", "Nystromformer", "Longformer", "Linformer", "Reformer",
               "Performer", "YOSO-16", "YOSO-32", "YOSO-64", "YOSO-128", "YOSO-C-16", "YOSO-C-32", "*YOSO-16",
               "*YOSO-32", "*YOSO-C-16", "Local Attention", "Sparse Transformer", "Sinkhorn Transformer",
               "Synthesizer", "BigBird", "Linear Transformer", "RFA", "LSH", "LHA"]
MISSING, FAILED = "—", "failed"
# Our label → the name a paper's table uses for the same mechanism, when it differs.
PAPER_NAMES = {"Softmax": ["Softmax", "Transformer"]}
# which duplicate of a (backend, setup, task, seed) to keep
STATUS_RANK = {"completed": 0, "running": 1, "interrupted": 1, "failed": 2}
FINISHED = ("completed", "failed")  # any other status (running, interrupted) is an unfinished run


def base_label(label: str) -> tuple:
    """(the attention's label, whether the row is self-pretrained): "YOSO-32 +SPT" → ("YOSO-32", True)."""
    pretrained = label.endswith(SPT_SUFFIX)
    return (label[: -len(SPT_SUFFIX)] if pretrained else label), pretrained


def label_key(label: str):
    """From-scratch rows first, then the self-pretrained ones, each block in the YOSO paper's order."""
    base, pretrained = base_label(label)
    return (pretrained, 0, LABEL_ORDER.index(base), base) if base in LABEL_ORDER else (pretrained, 1, 0, base)
