#!/usr/bin/env bash
# scripts/device_python.sh <dir>: builds the Python package (python/) with plain g++ into
# <dir>/tileattn, for a machine without CMake or PyPI (the lent Xeon): nanobind's sources from
# NANOBIND (default .whl/nanobind, a copy of the PyPI package's folder), the Python headers of
# `python3`, the kernels without -march (dispatched at run time), -O3, JOBS (default nproc)
# units at a time. Then: PYTHONPATH=<dir> python3 -c "import tileattn".
set -euo pipefail
cd "$(dirname "$0")/.."
out="${1:?usage: device_python.sh <dir>}"
nb="${NANOBIND:-.whl/nanobind}"
py_include="$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["include"])')"
suffix="$(python3 -c 'import sysconfig; print(sysconfig.get_config_var("EXT_SUFFIX"))')"
[[ -f "$py_include/Python.h" ]] || { echo "device_python: no Python.h in $py_include" >&2; exit 1; }
mkdir -p "$out/obj" "$out/tileattn"
flags="-std=c++20 -O3 -DNDEBUG -fPIC -fopenmp -fvisibility=hidden -Iinclude -I$nb/include
       -I$nb/ext/robin_map/include -I$py_include -DTILEATTN_EXTERN_TEMPLATES=1"
export flags out
printf '%s\n' "$nb/src/nb_combined.cpp" src/instantiations_forward.cpp src/instantiations_backward.cpp \
  src/instantiations_paged.cpp python/src/*.cpp |
  xargs -P "${JOBS:-$(nproc)}" -I{} sh -c 'g++ $flags -c {} -o "$out/obj/$(basename {} .cpp).o"'
g++ -shared -fopenmp "$out"/obj/*.o -o "$out/tileattn/_C$suffix"
cp python/tileattn/*.py "$out/tileattn/"
echo "device_python: built $out/tileattn/_C$suffix"
