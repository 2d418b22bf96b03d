# Stages and pipeline: host tests, error-path tests, and compile-fail tests that prove
# a mismatched pipeline does not build and that the error names both types.
conveyor_host_test(test_pipeline host/test_pipeline.cpp)
conveyor_host_test(test_service_alloc host/test_service_alloc.cpp)  # replaces operator new: alone
conveyor_host_test(test_placement host/test_placement.cpp)
if(EXISTS ${CMAKE_CURRENT_SOURCE_DIR}/host/test_errors.cpp)
  conveyor_host_test(test_errors host/test_errors.cpp)
endif()
include(${CMAKE_CURRENT_SOURCE_DIR}/compile_fail/compile_fail.cmake OPTIONAL)
conveyor_host_test(test_gpu_segment host/test_gpu_segment.cpp)
