"""lra-train's Hydra config files as a resource package (installed as ``lra.conf``; found with importlib.resources)."""
