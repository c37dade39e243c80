# tests/package/run_consumer.cmake: configures, builds and runs one consumer project of tileattn
# (cmake -P script, driven by tests/package/CMakeLists.txt).
#
# MODE=find_package:     installs INSTALL_FROM into PREFIX first and points the consumer at it
#                        with CMAKE_PREFIX_PATH; checks tileattn was found there and not elsewhere.
# MODE=add_subdirectory: hands the consumer TILEATTN_SOURCE_DIR and the backend options.
# Then checks that the program exits 0 and reports exactly the backends this build enabled.

cmake_minimum_required(VERSION 3.20)

foreach(var MODE SOURCE_DIR BINARY_DIR EXECUTABLE GENERATOR CXX_COMPILER BUILD_TYPE WITH_OPENMP WITH_TBB)
  if(NOT DEFINED ${var} OR "${${var}}" STREQUAL "")
    message(FATAL_ERROR "run_consumer.cmake: -D${var}=... is required")
  endif()
endforeach()

# Runs a command; on failure prints its output and stops the test.
function(run_step what)
  execute_process(COMMAND ${ARGN}
                  RESULT_VARIABLE result OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT result EQUAL 0)
    message(FATAL_ERROR "${what} failed (${result}):\n${ARGN}\n${out}\n${err}")
  endif()
  message(STATUS "${what}: ok")
endfunction()

file(REMOVE_RECURSE "${BINARY_DIR}")
set(configure_args
  -S "${SOURCE_DIR}" -B "${BINARY_DIR}" -G "${GENERATOR}"
  "-DCMAKE_CXX_COMPILER=${CXX_COMPILER}"
  "-DCMAKE_BUILD_TYPE=${BUILD_TYPE}")
if(MAKE_PROGRAM)
  list(APPEND configure_args "-DCMAKE_MAKE_PROGRAM=${MAKE_PROGRAM}")
endif()

if(MODE STREQUAL "find_package")
  foreach(var INSTALL_FROM PREFIX)
    if(NOT ${var})
      message(FATAL_ERROR "run_consumer.cmake: MODE=find_package needs -D${var}=...")
    endif()
  endforeach()
  file(REMOVE_RECURSE "${PREFIX}")
  run_step("cmake --install into ${PREFIX}"
           "${CMAKE_COMMAND}" --install "${INSTALL_FROM}" --prefix "${PREFIX}" --config "${BUILD_TYPE}")
  file(GLOB_RECURSE installed_configs "${PREFIX}/*/tileattnConfig.cmake")
  if(NOT EXISTS "${PREFIX}/include/tileattn/tileattn.hpp" OR NOT installed_configs)
    message(FATAL_ERROR "the install into ${PREFIX} lacks tileattn/tileattn.hpp or tileattnConfig.cmake")
  endif()
  list(APPEND configure_args
    "-DCMAKE_PREFIX_PATH=${PREFIX}"
    -DCMAKE_FIND_PACKAGE_NO_PACKAGE_REGISTRY=ON
    -DCMAKE_FIND_PACKAGE_NO_SYSTEM_PACKAGE_REGISTRY=ON)
elseif(MODE STREQUAL "add_subdirectory")
  if(NOT TILEATTN_SOURCE_DIR)
    message(FATAL_ERROR "run_consumer.cmake: MODE=add_subdirectory needs -DTILEATTN_SOURCE_DIR=...")
  endif()
  list(APPEND configure_args
    "-DTILEATTN_SOURCE_DIR=${TILEATTN_SOURCE_DIR}"
    "-DTILEATTN_WITH_OPENMP=${WITH_OPENMP}"
    "-DTILEATTN_WITH_TBB=${WITH_TBB}")
else()
  message(FATAL_ERROR "run_consumer.cmake: unknown MODE '${MODE}'")
endif()

run_step("configure ${SOURCE_DIR}" "${CMAKE_COMMAND}" ${configure_args})

if(MODE STREQUAL "find_package")
  # The package must come from the fresh prefix, not from a system install or the build tree.
  file(STRINGS "${BINARY_DIR}/CMakeCache.txt" found_dir REGEX "^tileattn_DIR:")
  string(REGEX REPLACE "^tileattn_DIR:[A-Z]+=" "" found_dir "${found_dir}")
  file(REAL_PATH "${PREFIX}" real_prefix)
  file(REAL_PATH "${found_dir}" real_found_dir)
  string(FIND "${real_found_dir}/" "${real_prefix}/" at)
  if(NOT at EQUAL 0)
    message(FATAL_ERROR "tileattn was found in '${found_dir}', not under the prefix '${PREFIX}'")
  endif()
  message(STATUS "tileattn_DIR = ${found_dir}")
endif()

run_step("build" "${CMAKE_COMMAND}" --build "${BINARY_DIR}" --config "${BUILD_TYPE}")

set(program "${BINARY_DIR}/${EXECUTABLE}")
if(NOT EXISTS "${program}")
  set(program "${BINARY_DIR}/${BUILD_TYPE}/${EXECUTABLE}")
endif()
execute_process(COMMAND "${program}" RESULT_VARIABLE result OUTPUT_VARIABLE out ERROR_VARIABLE err)
message("${out}${err}")
if(NOT result EQUAL 0)
  message(FATAL_ERROR "${EXECUTABLE} failed (${result})")
endif()

# The consumer must see the same backends as this build: OpenMP through -fopenmp from
# OpenMP::OpenMP_CXX, oneTBB through TILEATTN_HAS_TBB=1 and TBB::tbb.
foreach(backend openmp tbb)
  string(TOUPPER "${backend}" upper)
  if(WITH_${upper})
    set(expected "backend ${backend} +causal=1 [^\n]* ok")
  else()
    set(expected "backend ${backend} +not compiled in")
  endif()
  if(NOT out MATCHES "${expected}")
    message(FATAL_ERROR "expected the consumer's output to match '${expected}' (TILEATTN_WITH_${upper}=${WITH_${upper}})")
  endif()
endforeach()
message(STATUS "${MODE} consumer: ok")
