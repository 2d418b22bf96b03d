# bench_autotune: conveyor::autotune against an exhaustive grid on three planted pipelines
# (included by benchmarks/CMakeLists.txt). Host runtime only.
conveyor_benchmark(bench_autotune bench_autotune.cpp)
