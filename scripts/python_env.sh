#!/usr/bin/env bash
# scripts/python_env.sh <venv> [build|test]: the Python environment of the package in python/,
# from PyPI: `build` installs what building the extension needs (nanobind, scikit-build-core,
# NumPy, pytest), `test` adds what its tests compare against (PyTorch, transformers). Quiet;
# a second call finds everything installed and returns in a second. pip keeps its cache
# (~/.cache/pip), so a machine that ran it once installs PyTorch without downloading it.
set -euo pipefail

venv="${1:?usage: python_env.sh <venv> [build|test]}"
what="${2:-build}"
python="${PYTHON:-python3}"

[[ -x "$venv/bin/python" ]] || "$python" -m venv "$venv"
# --no-compile: no .pyc for the thousands of modules of torch that the tests never import
# (Python compiles the ones they do on first import).
pip=("$venv/bin/python" -m pip install --quiet --disable-pip-version-check --no-compile)
"${pip[@]}" "nanobind>=2.0" "scikit-build-core>=0.10" numpy pytest
if [[ "$what" == test ]]; then
  # PyPI's torch wheel for Linux brings its CUDA libraries (~3 GB, about a minute here); the
  # CPU-only wheels live on download.pytorch.org, which CI's machines do not reach.
  "${pip[@]}" "torch>=2.4" transformers
fi
