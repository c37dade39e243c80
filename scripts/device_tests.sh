#!/usr/bin/env bash
# scripts/device_tests.sh: builds test files with plain g++ and runs them, for a machine without
# Debian's packages or CMake's finds (the lent Xeon, where the AMX kernels can run): GoogleTest
# compiled from a source tree, -O3 -march=native -fopenmp as the Release build, no oneTBB.
#   GTEST_SRC=dir bash scripts/device_tests.sh tests/arch/amx_kernels_test.cpp tests/kernels/backward_test.cpp
# GTEST_SRC (default .gtest/googletest) is a copy of Debian's /usr/src/googletest/googletest;
# binaries go to OUT_DIR (default /tmp/device_tests), built JOBS (default nproc) at a time.
# Prints each binary's last lines (the passed/failed summary); exits non-zero if any failed.
set -u
cd "$(dirname "$0")/.."
G=${GTEST_SRC:-.gtest/googletest}
B=${OUT_DIR:-/tmp/device_tests}
mkdir -p "$B"
F="-std=c++20 -O3 -DNDEBUG -march=native -fopenmp"
if [ ! -f "$B/libgtest.a" ]; then
  g++ $F -I"$G/include" -I"$G" -c "$G/src/gtest-all.cc" -o "$B/gtest-all.o" &&
    g++ $F -I"$G/include" -c "$G/src/gtest_main.cc" -o "$B/gtest_main.o" &&
    ar rcs "$B/libgtest.a" "$B/gtest-all.o" "$B/gtest_main.o" || exit 1
fi
export F G B
printf '%s\n' "$@" | xargs -P "${JOBS:-$(nproc)}" -I{} sh -c \
  'n=$(basename {} .cpp); g++ $F -Iinclude -Itests -I"$G/include" {} "$B/libgtest.a" -lpthread -o "$B/$n" 2> "$B/$n.build.log" || { echo "BUILD FAILED: {}"; tail -20 "$B/$n.build.log"; }'
status=0
for src in "$@"; do
  n=$(basename "$src" .cpp)
  [ -x "$B/$n" ] || { status=1; continue; }
  echo "=== $n"
  "$B/$n" --gtest_brief=1 > "$B/$n.log" 2>&1 || status=1
  grep -E "^\[ amx \]|FAILED|Failure|PASSED|SKIPPED \]|tests ran" "$B/$n.log" | head -60
done
exit $status
