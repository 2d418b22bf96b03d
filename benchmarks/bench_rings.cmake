# bench_rings: conveyor's rings against peer queues in one binary (included by
# benchmarks/CMakeLists.txt). The peers are header-only Debian packages: libboost-dev
# (boost::lockfree), libreaderwriterqueue-dev and libconcurrentqueue-dev (moodycamel).
# Without them the benchmark is skipped with a warning; nothing else depends on it.
find_package(Boost 1.65 QUIET CONFIG)
find_path(CONVEYOR_CONCURRENTQUEUE_INCLUDE_DIR concurrentqueue/blockingconcurrentqueue.h)
find_path(CONVEYOR_READERWRITERQUEUE_INCLUDE_DIR readerwriterqueue/readerwritercircularbuffer.h)

if(NOT TARGET Boost::headers OR NOT CONVEYOR_CONCURRENTQUEUE_INCLUDE_DIR
   OR NOT CONVEYOR_READERWRITERQUEUE_INCLUDE_DIR)
  message(WARNING "conveyor: bench_rings skipped: it needs the peer queues' headers "
                  "(Debian: libboost-dev libreaderwriterqueue-dev libconcurrentqueue-dev)")
  return()
endif()

conveyor_benchmark(bench_rings bench_rings.cpp)
target_include_directories(bench_rings SYSTEM PRIVATE
  ${CONVEYOR_CONCURRENTQUEUE_INCLUDE_DIR} ${CONVEYOR_READERWRITERQUEUE_INCLUDE_DIR})
target_link_libraries(bench_rings PRIVATE Boost::headers)
