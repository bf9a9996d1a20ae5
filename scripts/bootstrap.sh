#!/usr/bin/env bash
# Creates (or refreshes) the project virtualenv and installs everything semimig needs.
#
# torch: a CUDA torch already importable by the system python is reused (the venv then sees
# the system site-packages); otherwise torch==2.13.0 is installed (the CPU build on the
# reference machines).  colossalai 0.5.0 pins torch<=2.5.1, so it goes in with --no-deps and
# requirements/runtime.txt lists what it really imports.
set -euo pipefail
VENV=${VENV:-.venv}
PYTHON=${PYTHON:-python3}
cd "$(dirname "$0")/.."
stamp="$VENV/.semimig-installed"
inputs=(setup.py requirements/runtime.txt requirements/test.txt scripts/bootstrap.sh)
if [ -f "$stamp" ] && [ -z "$(find "${inputs[@]}" -newer "$stamp")" ]; then
  exit 0
fi
if [ ! -x "$VENV/bin/python" ]; then
  if "$PYTHON" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
    echo "bootstrap: reusing the system's CUDA torch" >&2
    "$PYTHON" -m venv --system-site-packages "$VENV"
  else
    "$PYTHON" -m venv "$VENV"
  fi
fi
PIP=("$VENV/bin/python" -m pip install --quiet --disable-pip-version-check)
if ! "$VENV/bin/python" -c 'import torch' 2>/dev/null; then
  "${PIP[@]}" torch==2.13.0
fi
"${PIP[@]}" --no-deps colossalai==0.5.0
# torch is already there: the constraint keeps pip from replacing it with a CUDA build.
"$VENV/bin/python" -c 'import torch; print("torch==" + torch.__version__)' > "$VENV/torch-constraint.txt"
"${PIP[@]}" -c "$VENV/torch-constraint.txt" -r requirements/runtime.txt -r requirements/test.txt
# A CUDA torch brings its own matching triton; only a CPU torch needs one for the interpreter.
if ! "$VENV/bin/python" -c 'import triton' 2>/dev/null; then
  "${PIP[@]}" -c "$VENV/torch-constraint.txt" triton==3.9.0
fi
"${PIP[@]}" --no-deps --no-build-isolation -e .
touch "$stamp"
