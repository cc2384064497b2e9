# Installs Poseidon as a CMake package: headers under include/poseidon (the same paths as src/poseidon), the
# static libraries, the poseidon command, and lib/cmake/Poseidon, so that another project needs only
#   find_package(Poseidon REQUIRED)
#   target_link_libraries(app PRIVATE Poseidon::poseidon_torch)
# The core and the LibTorch part are separate export sets (components core and torch): a program that links
# only the core should not have to find LibTorch.
include(CMakePackageConfigHelpers)

set(POSEIDON_CMAKE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/Poseidon)

# Every header the libraries' users can reach; cli/ belongs to the poseidon command alone.
set(_poseidon_header_excludes PATTERN cli EXCLUDE)
if(NOT POSEIDON_WITH_TORCH)
  list(APPEND _poseidon_header_excludes PATTERN torch EXCLUDE)
endif()
install(DIRECTORY ${PROJECT_SOURCE_DIR}/src/poseidon/ DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/poseidon
  FILES_MATCHING PATTERN "*.h" ${_poseidon_header_excludes})

install(TARGETS poseidon_core EXPORT PoseidonCoreTargets ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR})
install(EXPORT PoseidonCoreTargets NAMESPACE Poseidon:: DESTINATION ${POSEIDON_CMAKE_DIR})
if(POSEIDON_WITH_TORCH)
  install(TARGETS poseidon_torch EXPORT PoseidonTorchTargets ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR})
  install(EXPORT PoseidonTorchTargets NAMESPACE Poseidon:: DESTINATION ${POSEIDON_CMAKE_DIR})
endif()
install(TARGETS poseidon RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
if(POSEIDON_WITH_TORCH)
  # Beside poseidon, where it looks for it (cli/torch_forward.cc).
  install(TARGETS poseidon_torch_command RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
endif()

configure_package_config_file(${CMAKE_CURRENT_LIST_DIR}/PoseidonConfig.cmake.in
  ${PROJECT_BINARY_DIR}/PoseidonConfig.cmake INSTALL_DESTINATION ${POSEIDON_CMAKE_DIR})
# 0.x: a minor release may change the API, so only the same major.minor is accepted.
write_basic_package_version_file(${PROJECT_BINARY_DIR}/PoseidonConfigVersion.cmake
  VERSION ${PROJECT_VERSION} COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/PoseidonConfig.cmake ${PROJECT_BINARY_DIR}/PoseidonConfigVersion.cmake
  DESTINATION ${POSEIDON_CMAKE_DIR})

# The Python package: under the prefix's dist-packages, which Debian's /usr/bin/python3 searches for
# /usr/local (the default prefix): after `cmake --install build`, `import poseidon` works.
if(TARGET poseidon_python)
  set(POSEIDON_PYTHON_INSTALL_DIR lib/python3/dist-packages CACHE STRING
      "where the poseidon Python package goes, relative to the install prefix")
  install(TARGETS poseidon_python LIBRARY DESTINATION ${POSEIDON_PYTHON_INSTALL_DIR}/poseidon)
  list(TRANSFORM POSEIDON_PYTHON_FILES PREPEND ${PROJECT_SOURCE_DIR}/python/poseidon/ OUTPUT_VARIABLE _poseidon_py)
  install(FILES ${_poseidon_py} DESTINATION ${POSEIDON_PYTHON_INSTALL_DIR}/poseidon)
endif()
