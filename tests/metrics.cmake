# Metrics: counters (histogram, interval union, stage/lane stats, trace buffer) and the
# layer on top (report, verdict, JSON, trace export, progress line, NVTX).
# nlohmann_json parses what the exporters write; only these tests link it.
find_package(nlohmann_json 3 REQUIRED)

set(_conveyor_metrics_tests
  histogram
  interval_union
  stage_stats
  trace
  report
  verdict
  progress
  nvtx
  pipeline)
foreach(_t IN LISTS _conveyor_metrics_tests)
  if(NOT EXISTS ${CMAKE_CURRENT_SOURCE_DIR}/host/test_metrics_${_t}.cpp)
    continue()
  endif()
  conveyor_host_test(test_metrics_${_t} host/test_metrics_${_t}.cpp)
  target_link_libraries(test_metrics_${_t} PRIVATE nlohmann_json::nlohmann_json)
endforeach()

# Planted bottlenecks on real host-runtime pipelines: one scenario per verdict case.
if(EXISTS ${CMAKE_CURRENT_SOURCE_DIR}/host/test_diagnosis.cpp)
  conveyor_host_test(test_diagnosis host/test_diagnosis.cpp)
endif()

# The same NVTX test against conveyor::cuda: NVTX3 is header-only, so it builds and runs
# without a GPU (no profiler attached: the calls are no-ops).
if(CONVEYOR_HAS_CUDA AND EXISTS ${CMAKE_CURRENT_SOURCE_DIR}/host/test_metrics_nvtx.cpp)
  conveyor_host_test(test_metrics_nvtx_cuda host/test_metrics_nvtx.cpp)
  target_link_libraries(test_metrics_nvtx_cuda PRIVATE conveyor::cuda)
endif()
