# The runtime layer's tests: the host runtime and the slot pool run everywhere; the CUDA
# runtime gets a no-device test binary (cuda headers from plain C++, error paths) and the
# GPU binary, which skips (exit 77) on machines where no device answers.
conveyor_host_test(test_host_runtime host/test_host_runtime.cpp)
conveyor_host_test(test_slot_pool host/test_slot_pool.cpp)
