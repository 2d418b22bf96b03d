# The runtime layer's tests: the host runtime and the slot pool run everywhere; the CUDA
# runtime gets a no-device test binary (cuda headers from plain C++, error paths) and the
# GPU binary, which skips (exit 77) on machines where no device answers.
conveyor_host_test(test_host_runtime host/test_host_runtime.cpp)
conveyor_host_test(test_slot_pool host/test_slot_pool.cpp)

if(CONVEYOR_HAS_CUDA)
  # The cuda headers from plain C++ and the paths that need no device; runs everywhere.
  add_executable(test_cuda_config gpu/test_cuda_config.cpp)
  target_link_libraries(test_cuda_config PRIVATE conveyor::cuda conveyor_catch_main conveyor_warnings)
  catch_discover_tests(test_cuda_config TEST_PREFIX "test_cuda_config: "
                       PROPERTIES TIMEOUT 120 LABELS cuda)

  # The GPU binary: one executable, its main() exits 77 when no device answers. A plain
  # add_test, because test discovery would have to run it on the build machine.
  add_executable(gpu_tests gpu/main.cpp gpu/test_cuda_runtime.cpp gpu/test_kernels.cu)
  target_link_libraries(gpu_tests PRIVATE conveyor::cuda Catch2::Catch2 conveyor_warnings)
  target_include_directories(gpu_tests PRIVATE ${CMAKE_CURRENT_SOURCE_DIR}/gpu)
  add_test(NAME gpu_tests COMMAND gpu_tests)
  set_tests_properties(gpu_tests PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT 600 LABELS gpu)
endif()
