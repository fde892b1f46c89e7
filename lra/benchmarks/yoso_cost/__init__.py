"""YOSO's GPU cost on paper: a cost model calibrated on the YOSO paper's GPU and projected on an H100.

    python -m lra.benchmarks.yoso_cost [--lengths 512 1024 ...] [--out FILE.md]

- :mod:`.gpu`: the machines (RTX 2080 Ti, H100) and one kernel's time on them;
- :mod:`.call`: one YOSO attention call (its shape and buckets) and the PyTorch work around the kernels;
- :mod:`.kernels`: csrc/yoso's CUDA kernels, sorted and atomic paths;
- :mod:`.authors_kernels`: the YOSO authors' kernels, to calibrate against the paper's Table 4;
- :mod:`.softmax_h100`: SDPA and eager softmax on an H100 at published throughput;
- :mod:`.report`: the tables the command prints.
"""
