"""The sources each task's data can come from (``task.source``; lra-prepare's ``--source``)."""

AUTO = "auto"  # task.source=auto: see lra.data.prepare.resolve_auto_source
SOURCES = {  # the concrete sources of each task; the first is lra-prepare's default
    "listops": ("generate", "lra_release"),
    "text": ("tfds", "aclimdb"),
    "retrieval": ("lra_release",),
    "image": ("tfds", "cifar_python"),
    "pathfinder": ("generate", "lra_release"),
}
# The sources read from files the user has (lra-prepare --path; task.path): the folder each wants.
PATH_OF = {"lra_release": "/path/to/lra_release", "aclimdb": "/path/to/aclImdb",
           "cifar_python": "/path/to/cifar-10-batches-py"}
