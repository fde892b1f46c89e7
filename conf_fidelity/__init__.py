"""lra-fidelity's presets as a resource package (installed as ``lra.conf_fidelity``; found with importlib.resources)."""
