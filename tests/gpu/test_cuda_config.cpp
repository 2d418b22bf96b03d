// The CUDA runtime's headers from plain C++, and the paths that need no device: the
// runtime concept, the check macros (api name, code, name, message, file:line, last
// error cleared), device discovery, and errors that are clear when no device answers.
// Runs on every machine with the CUDA toolkit, GPU or not.
#include "conveyor/runtime/cuda/runtime.hpp"

#include <catch2/catch.hpp>

#include <cstddef>
#include <string>
#include <type_traits>

#include "conveyor/base/error.hpp"
#include "conveyor/runtime/concepts.hpp"
#include "conveyor/runtime/host/runtime.hpp"
#include "conveyor/runtime/slot_pool.hpp"

namespace cuda = conveyor::cuda;
using Catch::Contains;

static_assert(conveyor::runtime<cuda::runtime>);
static_assert(conveyor::runtime<conveyor::host::runtime>);
static_assert(!std::is_same_v<cuda::pinned_span<float>, conveyor::host::pinned_span<float>>,
              "the two runtimes' memory types do not mix");
static_assert(!std::is_convertible_v<conveyor::host::device_span<float>, cuda::device_span<float>>);

namespace {
cudaError_t fails_with_invalid_value() { return cudaErrorInvalidValue; }
cublasStatus_t cublas_fails() { return CUBLAS_STATUS_INVALID_VALUE; }

// Nothing handled is left behind as the runtime's last error. Without a device the
// runtime cannot initialize, and every call, cudaPeekAtLastError included, reports that
// (no driver, or no device): a property of the machine, not a leftover.
void require_no_leftover_error() {
  const cudaError_t e = cudaPeekAtLastError();
  CAPTURE(static_cast<int>(e), cudaGetErrorName(e));
  if (cuda::device_count() == 0)
    REQUIRE((e == cudaSuccess || e == cudaErrorInsufficientDriver || e == cudaErrorNoDevice));
  else
    REQUIRE(e == cudaSuccess);
}
}  // namespace

TEST_CASE("CONVEYOR_CUDA_TRY: throws cuda_error with api, code, name, message and file:line") {
  const int line = __LINE__ + 2;
  try {
    CONVEYOR_CUDA_TRY(fails_with_invalid_value());
    FAIL("no exception");
  } catch (const conveyor::cuda_error& e) {
    CHECK(e.api() == "fails_with_invalid_value");
    CHECK(e.code() == static_cast<int>(cudaErrorInvalidValue));
    CHECK(e.code_name() == "cudaErrorInvalidValue");
    CHECK(e.line() == line);
    CHECK_THAT(std::string(e.file()), Catch::EndsWith("test_cuda_config.cpp"));
    CHECK_THAT(std::string(e.what()),
               Contains("fails_with_invalid_value failed: cudaErrorInvalidValue (1)") &&
                   Contains(cudaGetErrorString(cudaErrorInvalidValue)) &&
                   Contains("test_cuda_config.cpp:" + std::to_string(line)));
  }
  REQUIRE_NOTHROW([] { CONVEYOR_CUDA_TRY(cudaSuccess); }());
  CHECK(conveyor::detail::cuda_api_name("::cudaMemcpyAsync(dst, src, n, kind, s)") ==
        "cudaMemcpyAsync");
  CHECK(conveyor::detail::cuda_api_name("status") == "status");
}

TEST_CASE("CONVEYOR_CUBLAS_TRY: throws cuda_error carrying the cuBLAS status") {
  try {
    CONVEYOR_CUBLAS_TRY(cublas_fails());
    FAIL("no exception");
  } catch (const conveyor::cuda_error& e) {
    CHECK(e.api() == "cublas_fails");
    CHECK(e.code() == static_cast<int>(CUBLAS_STATUS_INVALID_VALUE));
    CHECK(e.code_name() == "CUBLAS_STATUS_INVALID_VALUE");
  }
}

TEST_CASE("CONVEYOR_CUDA_LOG and _ASSERT never throw") {
  REQUIRE_NOTHROW([] { CONVEYOR_CUDA_LOG(fails_with_invalid_value()); }());
  // A context-gone error: logged at most, never an abort, in any build.
  REQUIRE_NOTHROW([] { CONVEYOR_CUDA_ASSERT(cudaErrorCudartUnloading); }());
  require_no_leftover_error();
}

TEST_CASE("cuda device: counting never throws, and a missing device is a clear error") {
  const int n = cuda::device_count();
  REQUIRE(n >= 0);
  CAPTURE(n);
  if (n == 0) {
    REQUIRE_THROWS_AS(cuda::require_device(0), conveyor::error);
    REQUIRE_THROWS_WITH(cuda::require_device(0), Contains("no CUDA device answers"));
    // Making a stream or an allocation without a device fails with cuda_error, not a crash.
    REQUIRE_THROWS_AS(cuda::stream{}, conveyor::cuda_error);
    REQUIRE_THROWS_WITH(cuda::pinned_buffer<float>(1024, "staging in"),
                        Contains("pinned allocation of 4096 bytes for pool 'staging in' failed"));
    REQUIRE_THROWS_WITH(cuda::device_buffer<double>(8, "activations"),
                        Contains("device allocation of 64 bytes for pool 'activations' failed"));
  } else {
    REQUIRE_THROWS_WITH(cuda::require_device(n), Contains("requested but only"));
  }
  REQUIRE_THROWS_AS(cuda::require_device(-1), conveyor::error);
  require_no_leftover_error();
}

TEST_CASE("cuda memory: absurd sizes and zero sizes need no device") {
  REQUIRE_THROWS_AS(cuda::device_buffer<float>(std::size_t{1} << 40, "x"), conveyor::config_error);
  REQUIRE_THROWS_WITH(cuda::pinned_buffer<float>(~std::size_t{0}, "staging"),
                      Contains("'staging'") && Contains("1 TiB"));
  cuda::device_buffer<float> empty{0};  // allocates nothing, so works anywhere
  REQUIRE(empty.data() == nullptr);
  REQUIRE(empty.span().size() == 0);
  REQUIRE_THROWS_AS((conveyor::slot_pool<cuda::runtime, float>(0, 1, 1)), conveyor::config_error);
}
