"""Gather-pruned GEMM kernels; shipped as ``semimig.kernels``."""
if __name__ == "kernels":  # imported as a top-level module from a source checkout
    raise ImportError(
        "the repository folder 'kernels' is semimig's subpackage 'semimig.kernels'; "
        "it is not a top-level module (a PyPI package named 'kernels' exists)"
    )
