"""The YOSO kernel sources as a resource package (installed as ``attention_zoo.csrc``), compiled on first use by attention_zoo._yoso_build."""
