# bench_pipeline: conveyor's pipeline against oneTBB's parallel_pipeline and a serial loop,
# same stages, one binary (included by benchmarks/CMakeLists.txt). The peer is oneTBB
# (Debian: libtbb-dev). Without it the benchmark is skipped with a warning, as bench_rings
# is without its peers; nothing else depends on it.
find_package(TBB QUIET CONFIG)

if(NOT TARGET TBB::tbb)
  message(WARNING "conveyor: bench_pipeline skipped: it needs oneTBB as the peer pipeline "
                  "(Debian: libtbb-dev)")
  return()
endif()

conveyor_benchmark(bench_pipeline bench_pipeline.cpp)
target_link_libraries(bench_pipeline PRIVATE TBB::tbb)
