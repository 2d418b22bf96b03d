# Packaging tests (included by tests/CMakeLists.txt): conveyor as a user project sees it.
#   packaging.install                   cmake --install into a fresh prefix under the build dir
#   packaging.find_package.install_tree find_package(conveyor CONFIG) from that prefix
#   packaging.find_package.build_tree   find_package(conveyor CONFIG) from this build tree
#   packaging.add_subdirectory          add_subdirectory(<conveyor source tree>)
#   packaging.no_cuda_toolkit.*         find_package(conveyor CONFIG) from either tree with the
#                                       CUDA toolkit hidden: conveyor::conveyor, no conveyor::cuda
# Each consumer under tests/cmake/ is configured, built and run by ctest --build-and-test
# with this build's generator, make program, C++ compiler and build type (and CUDA
# compiler/toolkit when CUDA is on). The consumers are plain builds even in
# CONVEYOR_SANITIZE configurations; a sanitized conveyor library brings its sanitizer's
# runtime to their link (the exported link option), so these tests run (and must pass)
# in the TSan and ASan/UBSan build directories unchanged.
set(_pkg_dir ${CMAKE_CURRENT_BINARY_DIR}/packaging)
set(_pkg_prefix ${_pkg_dir}/prefix)
set(_pkg_timeout 600)  # configure + build of a small project; CUDA detection is the slow part

set(_pkg_build --build-generator ${CMAKE_GENERATOR})
if(CMAKE_MAKE_PROGRAM)
  list(APPEND _pkg_build --build-makeprogram ${CMAKE_MAKE_PROGRAM})
endif()
set(_pkg_options -DCMAKE_CXX_COMPILER=${CMAKE_CXX_COMPILER})
if(CMAKE_BUILD_TYPE)
  list(APPEND _pkg_options -DCMAKE_BUILD_TYPE=${CMAKE_BUILD_TYPE})
endif()
if(CONVEYOR_HAS_CUDA)
  # The same toolkit for find_dependency(CUDAToolkit) and the same nvcc for a vendored build.
  get_filename_component(_pkg_cuda_root ${CUDAToolkit_BIN_DIR} DIRECTORY)
  list(APPEND _pkg_options -DCUDAToolkit_ROOT=${_pkg_cuda_root}
       -DCMAKE_CUDA_COMPILER=${CMAKE_CUDA_COMPILER})
  if(CMAKE_CUDA_HOST_COMPILER)
    list(APPEND _pkg_options -DCMAKE_CUDA_HOST_COMPILER=${CMAKE_CUDA_HOST_COMPILER})
  endif()
endif()

# With no toolkit: no CUDA options, and find_package(CUDAToolkit) disabled and misdirected.
set(_pkg_host_options -DCMAKE_CXX_COMPILER=${CMAKE_CXX_COMPILER})
if(CMAKE_BUILD_TYPE)
  list(APPEND _pkg_host_options -DCMAKE_BUILD_TYPE=${CMAKE_BUILD_TYPE})
endif()
list(APPEND _pkg_host_options -DCMAKE_DISABLE_FIND_PACKAGE_CUDAToolkit=ON
     -DCUDAToolkit_ROOT=${_pkg_dir}/no-cuda-toolkit-here)

# conveyor_consumer_test(<name> <consumer dir> [HOST_ONLY] <extra -D options...>)
function(conveyor_consumer_test name consumer)
  set(src ${CMAKE_CURRENT_SOURCE_DIR}/cmake/${consumer})
  set(bin ${_pkg_dir}/${name})
  set(options ${_pkg_options})
  set(extra ${ARGN})
  if("HOST_ONLY" IN_LIST extra)
    list(REMOVE_ITEM extra HOST_ONLY)
    set(options ${_pkg_host_options})
  endif()
  add_test(NAME packaging.${name}
           COMMAND ${CMAKE_CTEST_COMMAND} --build-and-test ${src} ${bin} ${_pkg_build}
                   --build-project conveyor_${consumer}_consumer
                   --build-options ${options} ${extra}
                   --test-command ${bin}/consumer)
  set_tests_properties(packaging.${name} PROPERTIES TIMEOUT ${_pkg_timeout}
                       LABELS "host;packaging")
endfunction()

if(CONVEYOR_INSTALL)
  add_test(NAME packaging.install
           COMMAND ${CMAKE_COMMAND} -DBUILD_DIR=${PROJECT_BINARY_DIR} -DPREFIX=${_pkg_prefix}
                   -P ${CMAKE_CURRENT_SOURCE_DIR}/cmake/install_prefix.cmake)
  set_tests_properties(packaging.install PROPERTIES TIMEOUT 120 LABELS "host;packaging"
                       FIXTURES_SETUP conveyor_installed)
  conveyor_consumer_test(find_package.install_tree find_package
    -DCMAKE_PREFIX_PATH=${_pkg_prefix} -DCONVEYOR_EXPECTED_DIR=${_pkg_prefix})
  set_tests_properties(packaging.find_package.install_tree PROPERTIES
                       FIXTURES_REQUIRED conveyor_installed)
  conveyor_consumer_test(no_cuda_toolkit.install_tree no_cuda_toolkit HOST_ONLY
    -DCMAKE_PREFIX_PATH=${_pkg_prefix})
  set_tests_properties(packaging.no_cuda_toolkit.install_tree PROPERTIES
                       FIXTURES_REQUIRED conveyor_installed)
endif()

conveyor_consumer_test(find_package.build_tree find_package
  -Dconveyor_DIR=${PROJECT_BINARY_DIR} -DCONVEYOR_EXPECTED_DIR=${PROJECT_BINARY_DIR})
conveyor_consumer_test(no_cuda_toolkit.build_tree no_cuda_toolkit HOST_ONLY
  -Dconveyor_DIR=${PROJECT_BINARY_DIR})

conveyor_consumer_test(add_subdirectory add_subdirectory
  -DCONVEYOR_SOURCE_DIR=${PROJECT_SOURCE_DIR} -DCONVEYOR_WITH_CUDA=${CONVEYOR_WITH_CUDA})
