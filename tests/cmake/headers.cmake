# Every public header compiles on its own: one translation unit per header, which
# includes it twice (so a missing include or #pragma once fails the build, not a user's
# build that happens to include headers in another order). Checked against
# conveyor::conveyor, as a host-only consumer sees them; when CUDA is found, the CUDA
# runtime's headers and those that depend on CONVEYOR_HAS_CUDA also against conveyor::cuda.
file(GLOB_RECURSE _conveyor_headers RELATIVE ${PROJECT_SOURCE_DIR}/include
     CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/include/conveyor/*.hpp)
set(_host_sources)
set(_cuda_sources)
foreach(_header IN LISTS _conveyor_headers)
  string(MAKE_C_IDENTIFIER "${_header}" _id)
  set(_source ${CMAKE_CURRENT_BINARY_DIR}/header_check/${_id}.cpp)
  file(CONFIGURE OUTPUT ${_source}
       CONTENT "#include \"${_header}\"\n#include \"${_header}\"\n")
  file(STRINGS ${PROJECT_SOURCE_DIR}/include/${_header} _needs_cuda
       REGEX "^#include <(cuda|cublas|nvtx3)")
  file(STRINGS ${PROJECT_SOURCE_DIR}/include/${_header} _mentions_cuda
       REGEX "CONVEYOR_HAS_CUDA")
  if(_header MATCHES "^conveyor/runtime/cuda/")  # the CUDA runtime: needs CUDA throughout
    set(_needs_cuda TRUE)
  endif()
  if(NOT _needs_cuda)
    list(APPEND _host_sources ${_source})
  endif()
  if(_needs_cuda OR _mentions_cuda)
    list(APPEND _cuda_sources ${_source})
  endif()
endforeach()

add_library(conveyor_header_check OBJECT ${_host_sources})
target_link_libraries(conveyor_header_check PRIVATE conveyor::conveyor conveyor_warnings)
if(CONVEYOR_HAS_CUDA AND _cuda_sources)
  add_library(conveyor_cuda_header_check OBJECT ${_cuda_sources})
  target_link_libraries(conveyor_cuda_header_check PRIVATE conveyor::cuda conveyor_warnings)
endif()
