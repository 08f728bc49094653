# kite/cmake/toolchain-aarch64-linux-gnu.cmake — cross-compiling for aarch64 Linux with Debian's
# cross toolchain (apt-get install g++-aarch64-linux-gnu qemu-user). Target headers and
# libraries come from /usr/aarch64-linux-gnu only; programs (ninja, ccache) from the build
# machine. Binaries run under qemu-user (CMAKE_CROSSCOMPILING_EMULATOR, used by ctest).
#   cmake -S tests/ops_only -B build-arm64 -DCMAKE_TOOLCHAIN_FILE=cmake/toolchain-aarch64-linux-gnu.cmake
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)

set(KITE_CROSS_PREFIX aarch64-linux-gnu CACHE STRING "Prefix of the cross compiler's programs")
set(CMAKE_C_COMPILER ${KITE_CROSS_PREFIX}-gcc)
set(CMAKE_CXX_COMPILER ${KITE_CROSS_PREFIX}-g++)

set(CMAKE_FIND_ROOT_PATH /usr/${KITE_CROSS_PREFIX})
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_PACKAGE ONLY)

set(CMAKE_CROSSCOMPILING_EMULATOR qemu-aarch64 -L /usr/${KITE_CROSS_PREFIX})
