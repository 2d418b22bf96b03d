# bench_inference: end-to-end inference (uint8 images, CPU preprocessing, MLP + argmax on
# the device) as serial / batched / producer-queue loops and as a conveyor pipeline with
# 1..4 lanes (included by benchmarks/CMakeLists.txt). Uses the example model (src/models/): the
# cuBLAS MLP when CUDA is built and a device answers, the CPU reference on the host
# runtime otherwise.
conveyor_benchmark(bench_inference bench_inference.cpp)
target_link_libraries(bench_inference PRIVATE conveyor_models_ref)
if(TARGET conveyor_models)
  target_link_libraries(bench_inference PRIVATE conveyor_models)  # brings conveyor::cuda
endif()
