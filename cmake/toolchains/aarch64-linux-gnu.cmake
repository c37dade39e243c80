# cmake/toolchains/aarch64-linux-gnu.cmake: cross-compiles tileattn for 64-bit Arm Linux with
# Debian's g++-aarch64-linux-gnu, and runs what it builds (tests, gtest discovery) under
# qemu-aarch64 in user mode (scripts/arm_tests.sh). GoogleTest, oneTBB and the C++ runtime the
# binaries load come from Debian's arm64 packages (multiarch: libgtest-dev:arm64, libtbb-dev:arm64,
# libgomp1:arm64), not from the cross toolchain's own copy of glibc (/usr/aarch64-linux-gnu, which
# hangs in pthread_create under qemu-user here). The emulated CPU is
# QEMU_CPU's, read by qemu at each run (e.g. "max,sve-default-vector-length=32", "cortex-a72").
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)
set(CMAKE_C_COMPILER aarch64-linux-gnu-gcc)
set(CMAKE_CXX_COMPILER aarch64-linux-gnu-g++)
set(CMAKE_LIBRARY_ARCHITECTURE aarch64-linux-gnu)
set(CMAKE_CROSSCOMPILING_EMULATOR qemu-aarch64)
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
