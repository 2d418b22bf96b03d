# bench_serving: a conveyor service under Poisson traffic at ~70% of its capacity, clean,
# with poisoned requests and with tight deadlines (included by benchmarks/CMakeLists.txt).
# Host runtime only: no peer, no GPU.
conveyor_benchmark(bench_serving bench_serving.cpp)
