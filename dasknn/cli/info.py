"""`dasknn info`: this machine's devices, their measured SGEMM speed and the kernels in use."""

from __future__ import annotations

import argparse

from dasknn import __version__


def add_parser(sub, parents: list[argparse.ArgumentParser]) -> None:
    """`dasknn info` (no options of its own)."""
    sub.add_parser("info", help="device description and measured GFLOP/s", parents=parents).set_defaults(
        func=run
    )


def run(args) -> int:
    """Print this machine's device description and measured SGEMM speed."""
    from dasknn.backend import cupy_available, describe_device, sgemm_gflops

    print(f"dasknn {__version__}")
    print(f"cpu: {describe_device('cpu')}; SGEMM {sgemm_gflops('cpu'):.1f} GFLOP/s")
    if cupy_available():
        print(f"gpu: {describe_device('gpu')}; SGEMM {sgemm_gflops('gpu'):.1f} GFLOP/s")
    else:
        print("gpu: none (CuPy with a CUDA device not found)")
    from dasknn.nn.onednn import describe_kernels

    print("kernels:", describe_kernels())
    return 0
