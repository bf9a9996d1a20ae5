"""semimig: straggler-tolerant 1D tensor parallelism for Colossal-AI.

The repository folder ``kernels/`` ships as the subpackage ``semimig.kernels``.  There is
deliberately no top-level ``kernels`` module: a PyPI package of that name exists and
bitsandbytes (pulled in by colossalai) probes it at import time.
"""
from setuptools import setup

PACKAGES = [
    "semimig",
    "semimig._compat",
    "semimig.balancer",
    "semimig.nn",
    "semimig.shardformer",
    "semimig.comm",
    "semimig.resizing",
    "semimig.migration",
    "semimig.controller",
    "semimig.controller.sim",
    "semimig.resharder",
    "semimig.straggler",
    "semimig.allocation",
    "semimig.bench",
    "semimig.bench.llm",
    "semimig.hybrid",
    "semimig.kernels",
    "semimig.sharding",
    "semimig.cluster",
]

setup(
    name="semimig",
    version="0.1.0",
    description="ZERO-resizing and SEMI-migration for Colossal-AI 1D tensor parallelism",
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    python_requires=">=3.10",  # dataclass(kw_only=True)
    packages=PACKAGES,
    package_dir={"semimig.kernels": "kernels"},
    install_requires=[
        # colossalai 0.5.0 is installed with --no-deps (see scripts/bootstrap.sh).
        "torch>=2.2",
        "numpy",
        "scipy",
    ],
    # triton >= 3.0: the kernels call tl.dot(..., input_precision=...), which Triton 3.0 introduced
    extras_require={"triton": ["triton>=3.0,<4"], "nvml": ["nvidia-ml-py>=12"], "test": ["pytest", "pytest-timeout", "hypothesis", "import-linter"]},
    entry_points={"console_scripts": ["semimig=semimig.cli:main"]},
)
