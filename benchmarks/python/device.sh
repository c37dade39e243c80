#!/usr/bin/env bash
# benchmarks/python/device.sh <out-dir>: the Python package on a machine without CMake or PyPI
# (the lent Xeon): builds it with scripts/device_python.sh, runs its tests against the
# machine's own PyTorch (pytest from PYTEST_PATH, default .whl/pylib, when python3 has none),
# then bench_torch.py at 2 threads pinned to cores 0-1 (taskset) and at every core. Everything
# it prints goes to <out-dir>/python_device.txt, the benchmarks' JSON beside it.
set -uo pipefail
cd "$(dirname "$0")/../.."
out="${1:?usage: device.sh <out-dir>}"
log="$out/python_device.txt"
mkdir -p "$out"
{
  lscpu | grep -E "Model name|^CPU\(s\)|Thread|Core|Flags" | cut -c1-200
  python3 -c "import torch, sys; print('python', sys.version.split()[0], 'torch', torch.__version__)"
  start=$(date +%s)
  bash scripts/device_python.sh /tmp/tileattn_py || exit 1
  echo "build: $(( $(date +%s) - start )) s"
  export PYTHONPATH=/tmp/tileattn_py
  python3 -c "import pytest" 2>/dev/null || export PYTHONPATH="$PYTHONPATH:${PYTEST_PATH:-$PWD/.whl/pylib}"
  python3 -c "import tileattn; print('active_isa', tileattn.active_isa())"
  (cd python/tests && python3 -m pytest -q -p no:cacheprovider . 2>&1 | tail -15)
  cores=$(nproc)
  taskset -c 0,1 python3 benchmarks/python/bench_torch.py --threads 2 --json "$out/bench_2.json"
  python3 benchmarks/python/bench_torch.py --threads "$cores" --json "$out/bench_$cores.json"
} 2>&1 | tee "$log"
