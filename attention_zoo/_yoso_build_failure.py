"""The one line for a failed YOSO kernel build (:mod:`attention_zoo._yoso_build`): the compiler's first error,
the setting to fix, and where the build's full output is."""

from __future__ import annotations

import os
import re
import shlex

import torch

WORKER_FAILED = "lra-yoso-build-failed: "  # the build worker's own summary of why it failed

_COMPILER_ERROR = re.compile(r"\b(?:error|fatal\s*):|\bld: cannot |undefined reference to ")


def explain_failure(kind: str, output: str, log) -> str:
    """One line for a failed build: the compiler's first error line (else the worker's own summary),
    the setting responsible where one is set, the fix, and where the full output is."""
    lines = [line.strip() for line in output.splitlines()]
    cause = (next((line for line in lines if _COMPILER_ERROR.search(line) and not line.startswith("FAILED:")), None)
             or next((line[len(WORKER_FAILED):] for line in lines if line.startswith(WORKER_FAILED)), None)
             or next((line for line in reversed(lines) if line), "the build worker exited with no output"))
    cause, env, cuda = (cause if len(cause) <= 300 else cause[:297] + "..."), os.environ, kind == "cuda"
    culprits = [  # (the setting, whether this cause is its doing, the fix)
        ("LRA_KERNEL_CPU_ARCH", re.search(r"march|target CPU", cause),
         "is not a -march this compiler knows: set one it lists (e.g. x86-64-v3), or unset it for native"),
        ("TORCH_CUDA_ARCH_LIST", cuda and re.search(r"arch|sm_|compute_", cause, re.I),
         "is not a list of GPU architectures torch and nvcc build: set one such as '8.0 9.0+PTX'"),
        ("CXX", "compiler" in cause.lower() or env.get("CXX", "\0") in cause,
         "does not work as a C++ compiler: set CXX to one that does (e.g. g++), or unset it"),
        ("CUDA_HOME", cuda and re.search(r"nvcc|cuda", cause, re.I),
         f"has no working nvcc matching torch.version.cuda {torch.version.cuda}: install one, or fix CUDA_HOME"),
    ]
    settings = [f"{name}={shlex.quote(env[name])}" for name, *_ in culprits if env.get(name)]
    fix = next((f"{name}={shlex.quote(env[name])} {why}" for name, blamed, why in culprits if env.get(name) and blamed),
               f"fix the C++ compiler (with OpenMP){' or the CUDA toolkit' if cuda else ''}"
               + (f" or these settings: {', '.join(settings)}" if settings else ""))
    return f"building the YOSO {kind.upper()} kernels failed: {cause}; {fix}; or set attention.impl=torch (full output: {log})"
