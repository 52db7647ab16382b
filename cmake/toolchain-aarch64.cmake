# toolchain-aarch64.cmake - cross-builds rmsnorm for 64-bit ARM Linux (Debian's
# gcc-aarch64-linux-gnu; libraries from its sysroot /usr/aarch64-linux-gnu):
#   cmake -S . -B build-arm64 -DCMAKE_TOOLCHAIN_FILE=cmake/toolchain-aarch64.cmake
# Set RMSNORM_CROSS_PREFIX (default aarch64-linux-gnu-) for another triple's
# compiler, RMSNORM_CROSS_SYSROOT for another sysroot. When qemu-aarch64 is
# found, tests run under it (ctest works on an x86 host; docs/arm64.md).
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)

if(NOT DEFINED RMSNORM_CROSS_PREFIX)
  set(RMSNORM_CROSS_PREFIX aarch64-linux-gnu-)
endif()
if(NOT DEFINED RMSNORM_CROSS_SYSROOT)
  set(RMSNORM_CROSS_SYSROOT /usr/aarch64-linux-gnu)
endif()
if(NOT CMAKE_C_COMPILER)
  set(CMAKE_C_COMPILER ${RMSNORM_CROSS_PREFIX}gcc)
endif()
if(NOT CMAKE_CXX_COMPILER)
  set(CMAKE_CXX_COMPILER ${RMSNORM_CROSS_PREFIX}g++)
endif()

# Look for libraries and headers in the target's tree only (no host BLAS or
# MPI: those are x86 libraries), programs on the host.
set(CMAKE_FIND_ROOT_PATH ${RMSNORM_CROSS_SYSROOT})
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE ONLY)
# (a project that finds an installed rmsnorm outside the sysroot passes
# -DCMAKE_FIND_ROOT_PATH_MODE_PACKAGE=BOTH)
if(NOT CMAKE_FIND_ROOT_PATH_MODE_PACKAGE)
  set(CMAKE_FIND_ROOT_PATH_MODE_PACKAGE ONLY)
endif()
# pkg-config must not hand out the host's .pc files either
set(ENV{PKG_CONFIG_LIBDIR} ${RMSNORM_CROSS_SYSROOT}/lib/pkgconfig)
set(ENV{PKG_CONFIG_SYSROOT_DIR} ${RMSNORM_CROSS_SYSROOT})

# Run the tests' programs under user-mode emulation when it is there;
# RMSNORM_QEMU_CPU picks the emulated CPU (max, cortex-a57, ...).
if(NOT DEFINED CMAKE_CROSSCOMPILING_EMULATOR)
  find_program(RMSNORM_QEMU_AARCH64 qemu-aarch64)
  if(RMSNORM_QEMU_AARCH64)
    if(NOT DEFINED RMSNORM_QEMU_CPU)
      set(RMSNORM_QEMU_CPU max)
    endif()
    set(CMAKE_CROSSCOMPILING_EMULATOR
      ${RMSNORM_QEMU_AARCH64} -L ${RMSNORM_CROSS_SYSROOT} -cpu ${RMSNORM_QEMU_CPU})
  endif()
endif()
