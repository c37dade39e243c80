# cmake/install.cmake: install rules and the CMake package config for find_package(tileattn).
#
# Included by the top-level CMakeLists.txt when TILEATTN_INSTALL is ON. Installs the headers,
# the exported INTERFACE target tileattn::tileattn, tileattnConfig.cmake and its version file.
# The config re-finds OpenMP and oneTBB only when this build enabled them, because the
# exported target links OpenMP::OpenMP_CXX and TBB::tbb (and defines TILEATTN_HAS_TBB=1) then;
# and MPI when TILEATTN_WITH_MPI exported tileattn::distributed, which links MPI::MPI_CXX.

include(CMakePackageConfigHelpers)

set(TILEATTN_INSTALL_CMAKEDIR "${CMAKE_INSTALL_DATADIR}/cmake/tileattn"
    CACHE STRING "Where tileattnConfig.cmake is installed, relative to the install prefix")

install(DIRECTORY "${tileattn_SOURCE_DIR}/include/"
        DESTINATION "${CMAKE_INSTALL_INCLUDEDIR}"
        FILES_MATCHING PATTERN "*.hpp")

install(TARGETS tileattn EXPORT tileattnTargets)
if(TILEATTN_BUILD_INSTANTIATIONS)
  install(TARGETS tileattn_instantiations EXPORT tileattnTargets
          ARCHIVE DESTINATION "${CMAKE_INSTALL_LIBDIR}")
endif()
if(TILEATTN_WITH_MPI)
  install(TARGETS tileattn_distributed EXPORT tileattnTargets)
endif()
install(EXPORT tileattnTargets
        NAMESPACE tileattn::
        FILE tileattnTargets.cmake
        DESTINATION "${TILEATTN_INSTALL_CMAKEDIR}")

# Normalize the options to ON/OFF so the generated config reads plainly.
if(TILEATTN_WITH_OPENMP)
  set(TILEATTN_CONFIG_WITH_OPENMP ON)
else()
  set(TILEATTN_CONFIG_WITH_OPENMP OFF)
endif()
if(TILEATTN_WITH_MPI)
  set(TILEATTN_CONFIG_WITH_MPI ON)
else()
  set(TILEATTN_CONFIG_WITH_MPI OFF)
endif()
if(TILEATTN_WITH_TBB)
  set(TILEATTN_CONFIG_WITH_TBB ON)
else()
  set(TILEATTN_CONFIG_WITH_TBB OFF)
endif()

configure_package_config_file(
  "${tileattn_SOURCE_DIR}/cmake/tileattnConfig.cmake.in"
  "${tileattn_BINARY_DIR}/tileattnConfig.cmake"
  INSTALL_DESTINATION "${TILEATTN_INSTALL_CMAKEDIR}")

# Header-only: the package fits any architecture, so the version file does not check
# CMAKE_SIZEOF_VOID_P.
write_basic_package_version_file(
  "${tileattn_BINARY_DIR}/tileattnConfigVersion.cmake"
  VERSION "${tileattn_VERSION}"
  COMPATIBILITY SameMajorVersion
  ARCH_INDEPENDENT)

install(FILES
          "${tileattn_BINARY_DIR}/tileattnConfig.cmake"
          "${tileattn_BINARY_DIR}/tileattnConfigVersion.cmake"
        DESTINATION "${TILEATTN_INSTALL_CMAKEDIR}")

install(FILES "${tileattn_SOURCE_DIR}/LICENSE" "${tileattn_SOURCE_DIR}/README.md"
        DESTINATION "${CMAKE_INSTALL_DATADIR}/doc/tileattn")
