"""YOSO's GPU cost on paper: a cost model checked on the YOSO paper's GPU, fitted on one H100 trace and
held against every committed H100 measurement.

    python -m lra.benchmarks.yoso_cost [--lengths 512 1024 ...] [--out FILE.md]
    python -m lra.benchmarks.yoso_cost --measured [--out FILE.md]

- :mod:`.gpu`: the machines (RTX 2080 Ti, H100) and one kernel's time on them;
- :mod:`.call`: one YOSO attention call (its shape and buckets) and the statistics its kernels take;
- :mod:`.kernels`: csrc/yoso's CUDA kernels, sorted and atomic paths;
- :mod:`.ops`: the PyTorch ops of a call in order, their host cost and kernels (torch's sort included);
- :mod:`.host`: the host's side, eager and as CUDA graphs, and the wall time of host and GPU together;
- :mod:`.measured`, :mod:`.compare`: the committed H100 measurements (docs/gpu) beside the model's numbers;
- :mod:`.fit`: the H100's fitted constants, from one calibration trace;
- :mod:`.authors_kernels`: the YOSO authors' kernels, to check against the paper's Table 4;
- :mod:`.softmax_h100`: SDPA and eager softmax on an H100 at published throughput;
- :mod:`.report`: the tables the command prints.
"""
