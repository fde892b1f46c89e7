"""lra-profile's presets as a resource package (installed as ``lra.conf_profile``; found with importlib.resources)."""
