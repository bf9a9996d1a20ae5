"""pytest configuration shared by every test module."""
import os

# Triton's interpreter must be chosen before triton is imported anywhere.
os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")
