"""``lra-build-kernels cpu cuda [--force]``: compile the YOSO kernels ahead of the first run that needs them
(:mod:`attention_zoo._yoso_build` does the work; this is its command's edge, under the signal policy)."""

from __future__ import annotations

from lra.commands.config_errors import at_the_edge


@at_the_edge
def main(argv=None) -> None:
    from attention_zoo import _yoso_build
    from lra.faults import fault_point

    # A build interrupted once its worker runs (LRA_FAULT=kernel_build:1:SIGINT) stops it and leaves no half-build.
    _yoso_build.WORKER_STARTED.append(lambda: fault_point("kernel_build"))
    _yoso_build.main(argv)
