# The example model's tests (src/models/): the CPU references and the host-runtime model run
# everywhere; the GPU kernels and the cuBLAS MLP join the gpu_tests binary when CUDA is built.
conveyor_host_test(test_models_reference host/test_models_reference.cpp)
target_link_libraries(test_models_reference PRIVATE conveyor_models_ref)

if(TARGET gpu_tests AND TARGET conveyor_models)
  target_sources(gpu_tests PRIVATE gpu/test_models.cpp gpu/test_trained_mlp.cpp)
  target_link_libraries(gpu_tests PRIVATE conveyor_models)
endif()

# Fashion-MNIST's IDX reader and the trained weights' file, on small files the test writes.
conveyor_host_test(test_fashion_mnist host/test_fashion_mnist.cpp)
target_link_libraries(test_fashion_mnist PRIVATE conveyor_models_ref)
