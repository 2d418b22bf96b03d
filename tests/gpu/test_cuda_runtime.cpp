// The CUDA runtime on a real device: RAII handles (move-assignment between two non-empty
// handles included), event semantics, stream waits and slot reuse proven with spin-gate
// kernels, two lanes that really run concurrently, copies and cuBLAS, allocation and
// launch errors surfacing as cuda_error, and pinned vs pageable told apart at compile
// time. Compiled by the host compiler: the cuda headers need no nvcc.
#include "conveyor/pipeline.hpp"
#include "conveyor/runtime/cuda/runtime.hpp"

#include <catch2/catch.hpp>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <ranges>
#include <span>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include "conveyor/base/error.hpp"
#include "conveyor/runtime/concepts.hpp"
#include "conveyor/runtime/detail/cuda_counters.hpp"
#include "conveyor/runtime/slot_pool.hpp"
#include "test_kernels.hpp"

namespace cuda = conveyor::cuda;
namespace gpu = conveyor::test::gpu;
using conveyor::event_timing;
using counters = conveyor::detail::cuda_counters;

// ---- compile-time contract: pinned vs pageable --------------------------------------

template <class Dst, class Src, class Stream>
concept can_copy_async = requires(Dst d, Src src, Stream s) { copy_async(d, src, s); };

static_assert(conveyor::runtime<cuda::runtime>);
static_assert(cuda::runtime::name == "cuda");
static_assert(can_copy_async<cuda::device_span<float>, cuda::pinned_span<float>, cuda::stream_ref>);
static_assert(
    can_copy_async<cuda::pinned_span<float>, cuda::device_span<const float>, cuda::stream_ref>);
static_assert(!can_copy_async<cuda::device_span<float>, std::vector<float>&, cuda::stream_ref>,
              "pageable memory must not reach cudaMemcpyAsync: it would silently synchronize");
static_assert(
    !can_copy_async<std::vector<float>&, cuda::device_span<const float>, cuda::stream_ref>);
static_assert(!can_copy_async<cuda::device_span<float>, const float*, cuda::stream_ref>);
static_assert(!can_copy_async<cuda::device_span<float>, std::span<const float>, cuda::stream_ref>);
static_assert(!std::is_constructible_v<cuda::stream_ref, int>);
static_assert(!std::is_constructible_v<cuda::stream_ref, std::nullptr_t>);
static_assert(!std::is_convertible_v<cudaStream_t, cuda::stream_ref>,
              "wrapping a handle is explicit");

namespace {

// Reads what a kernel writes into pinned memory while the test thread polls it.
int peek(const int* p) { return *static_cast<const volatile int*>(p); }

constexpr long long timeout_ms = 5000;

}  // namespace

// ---- RAII ---------------------------------------------------------------------------

TEST_CASE(
    "cuda handles: move-assignment between two non-empty handles leaks and double-frees nothing") {
  const long streams0 = counters::live(counters::streams),
             events0 = counters::live(counters::events), pinned0 = counters::live(counters::pinned),
             device0 = counters::live(counters::device), blas0 = counters::live(counters::cublas);
  {
    cuda::stream a, b;
    REQUIRE(counters::live(counters::streams) == streams0 + 2);
    const cudaStream_t b_native = b.native();
    a = std::move(b);
    REQUIRE(counters::live(counters::streams) == streams0 + 1);
    REQUIRE(a.native() == b_native);
    REQUIRE(b.native() == nullptr);
    a.synchronize();  // the surviving handle works

    cudaStream_t raw = a.release();
    REQUIRE(counters::live(counters::streams) == streams0);
    cuda::stream adopted = cuda::stream::from_native(raw);
    REQUIRE(adopted.native() == raw);
    REQUIRE(counters::live(counters::streams) == streams0 + 1);

    cuda::event e1{event_timing::disabled}, e2{event_timing::enabled};
    REQUIRE(counters::live(counters::events) == events0 + 2);
    e1.record(adopted);
    e1 = std::move(e2);
    REQUIRE(counters::live(counters::events) == events0 + 1);
    REQUIRE(e1.timing_enabled());

    cuda::pinned_buffer<int> p1{16}, p2{32};
    cuda::device_buffer<int> d1{16}, d2{32};
    p1 = std::move(p2);
    d1 = std::move(d2);
    REQUIRE(counters::live(counters::pinned) == pinned0 + 1);
    REQUIRE(counters::live(counters::device) == device0 + 1);
    REQUIRE(p1.size() == 32);
    REQUIRE(p2.data() == nullptr);
    REQUIRE(d1.size_bytes() == 32 * sizeof(int));

    cuda::cublas_handle h1{adopted, 1 << 20}, h2{adopted, 2 << 20};
    REQUIRE(counters::live(counters::cublas) == blas0 + 2);
    h1 = std::move(h2);
    REQUIRE(counters::live(counters::cublas) == blas0 + 1);
    REQUIRE(h1.workspace_bytes() == std::size_t{2} << 20);
    REQUIRE(h2.native() == nullptr);
    adopted.synchronize();
  }
  REQUIRE(counters::live(counters::streams) == streams0);
  REQUIRE(counters::live(counters::events) == events0);
  REQUIRE(counters::live(counters::pinned) == pinned0);
  REQUIRE(counters::live(counters::device) == device0);
  REQUIRE(counters::live(counters::cublas) == blas0);
}

// ---- events and waits, proven with a spin gate ---------------------------------------
// Tagged [gate]: a kernel spins until the host opens a gate, so these need the host to go
// on while a kernel runs. compute-sanitizer serializes launches (memcheck failed one of
// them on an H100: the gate kernel had timed out before the host looked), so the sanitizer
// runs take them out: compute-sanitizer ... gpu_tests "~[gate]".

TEST_CASE(
    "cuda event: pending behind a gated kernel, complete after it, never-recorded is complete",
    "[gate]") {
  cuda::event never{event_timing::enabled};
  REQUIRE(never.query());

  cuda::stream s;
  cuda::pinned_buffer<int> host_flags{4};  // [0] gate, [1] started, [2] result
  for (int& x : host_flags.span()) x = 0;
  int* const f = host_flags.data();
  cuda::event start{event_timing::enabled}, end{event_timing::enabled};
  start.record(s);
  gpu::launch_spin_until(f + 0, 1, gpu::cycles_for_ms(timeout_ms), f + 1, f + 2, s.native());
  end.record(s);
  const bool end_pending = !end.query();  // the kernel spins until the host opens the gate
  *static_cast<volatile int*>(f + 0) = 1;
  end.synchronize();
  REQUIRE(end_pending);
  REQUIRE(peek(f + 2) == 1);  // the kernel saw the gate open, not its timeout
  REQUIRE(end.query());
  REQUIRE(elapsed_ms(start, end) >= 0.0f);

  cuda::event plain{event_timing::disabled};
  plain.record(s);
  plain.synchronize();
  REQUIRE_THROWS_AS(elapsed_ms(plain, end), conveyor::config_error);
}

TEST_CASE("cuda stream: wait() holds a stream until the event's stream reaches it", "[gate]") {
  cuda::stream a, b;
  cuda::pinned_buffer<int> host_flags{4};  // [0] gate, [1] started, [2] result, [3] seen
  for (int& x : host_flags.span()) x = 0;
  int* const f = host_flags.data();
  cuda::device_buffer<int> value{1};
  memset_async(value.span(), 0, a);
  gpu::launch_spin_until(f + 0, 1, gpu::cycles_for_ms(timeout_ms), f + 1, f + 2, a.native());
  gpu::launch_set_flag(value.data(), 42, a.native());
  cuda::event written{event_timing::disabled}, b_done{event_timing::disabled};
  written.record(a);
  b.ref().wait(written);
  copy_async(host_flags.span().subspan(3, 1), value.span(), b);
  b_done.record(b);
  const bool b_pending = !b_done.query();
  *static_cast<volatile int*>(f + 0) = 1;
  b.synchronize();
  REQUIRE(b_pending);
  REQUIRE(peek(f + 2) == 1);
  REQUIRE(peek(f + 3) == 42);  // b's copy ran after a's write
}

TEST_CASE("cuda streams: two lanes really run concurrently (spin-gate)", "[gate]") {
  int concurrent = 0;
  CONVEYOR_CUDA_TRY(
      cudaDeviceGetAttribute(&concurrent, cudaDevAttrConcurrentKernels, cuda::current_device()));
  REQUIRE(concurrent == 1);
  cuda::stream lane_a, lane_b;
  cuda::device_buffer<int> flag{1};
  memset_async(flag.span(), 0, lane_a);
  lane_a.synchronize();
  cuda::pinned_buffer<int> host_flags{2};  // [0] started, [1] result
  for (int& x : host_flags.span()) x = 0;
  int* const f = host_flags.data();
  // Lane A spins until lane B's kernel sets the flag. If the lanes serialized, A would
  // time out (result 0) before B ever ran.
  gpu::launch_spin_until(flag.data(), 1, gpu::cycles_for_ms(timeout_ms), f + 0, f + 1,
                         lane_a.native());
  while (peek(f + 0) == 0 && !lane_a.ref().ready()) std::this_thread::yield();  // A is running
  gpu::launch_set_flag(flag.data(), 1, lane_b.native());
  lane_a.synchronize();
  lane_b.synchronize();
  REQUIRE(peek(f + 1) == 1);
}

// ---- memory -------------------------------------------------------------------------

TEST_CASE("cuda memory: H2D, kernel, D2D, D2H and memset round trip") {
  const std::size_t n = GENERATE(1u, 1000u, 1u << 20);
  CAPTURE(n);
  cuda::stream s;
  cuda::pinned_buffer<float> in{n, "test in"}, out{n, "test out"};
  cuda::device_buffer<float> d1{n}, d2{n};
  for (std::size_t i = 0; i < n; ++i) in.span()[i] = static_cast<float>(i % 1000);
  copy_async(d1.span(), in.span(), s);
  gpu::launch_affine(d1.data(), d2.data(), n, 2.0f, 1.0f, s.native());
  copy_async(d1.span(), d2.span(), s);
  copy_async(out.span(), d1.span(), s);
  s.synchronize();
  bool all = true;
  for (std::size_t i = 0; i < n; ++i)
    all &= (out.span()[i] == 2.0f * static_cast<float>(i % 1000) + 1.0f);
  REQUIRE(all);

  memset_async(d1.span(), 0, s);
  copy_async(out.span(), d1.span(), s);
  s.synchronize();
  for (float x : out.span()) REQUIRE(x == 0.0f);
  if (n > 1)
    REQUIRE_THROWS_AS(copy_async(d1.span().subspan(0, n - 1), in.span(), s),
                      conveyor::config_error);
}

TEST_CASE("cuda memory: a failed allocation names the bytes and the pool") {
  // passes the size check, no GPU has it
  const std::size_t almost_1tib = (std::size_t{1} << 40) - 1;
  REQUIRE_THROWS_AS(cuda::device_buffer<char>(almost_1tib, "huge activations"),
                    conveyor::cuda_error);
  REQUIRE_THROWS_WITH(cuda::device_buffer<char>(almost_1tib, "huge activations"),
                      Catch::Contains(std::to_string(almost_1tib) + " bytes") &&
                          Catch::Contains("'huge activations'") && Catch::Contains("cudaMalloc"));
  REQUIRE_THROWS_AS(cuda::pinned_buffer<float>(std::size_t{1} << 40, "x"), conveyor::config_error);
  REQUIRE(cudaPeekAtLastError() == cudaSuccess);  // the failure did not linger
}

TEST_CASE("cuda memory: adopting pageable memory as a pinned span is refused, in every build") {
  std::vector<float> pageable(16);
  REQUIRE_THROWS_AS(cuda::pinned_span<float>::from_native(pageable.data(), pageable.size()),
                    conveyor::config_error);
  REQUIRE_THROWS_WITH(cuda::pinned_span<float>::from_native(pageable.data(), pageable.size()),
                      Catch::Contains("not pinned host memory"));
  cuda::pinned_buffer<float> pinned{16};
  REQUIRE_NOTHROW(cuda::pinned_span<float>::from_native(pinned.data(), pinned.size()));
}

// Two lanes listed on one device (the list {0, 0}): each lane binds it; results right.
TEST_CASE("cuda gpu segment: lanes on the device list {0, 0}") {
  using R = cuda::runtime;
  auto g = conveyor::gpu<R, float, float>(
      {.lanes = 2, .in_elems = 64, .out_elems = 64, .devices = {0, 0}},
      [](std::vector<int>& b, R::pinned_span<float> dst) {
        for (std::size_t i = 0; i < b.size(); ++i) dst[i] = static_cast<float>(b[i]);
        return b.size();
      },
      [](conveyor::lane_batch<R, float, float>& l) {
        conveyor::test::gpu::launch_affine(l.in.data(), l.out.data(), l.items, 2.0f, 1.0f,
                                           l.stream.native());
        return l.items;
      },
      [](std::vector<int>&& b, R::pinned_span<const float> r) {
        for (std::size_t i = 0; i < b.size(); ++i) b[i] = static_cast<int>(r[i]);
        return b;
      });
  int next = 0, wrong = 0;
  conveyor::pipeline p{conveyor::from_range(std::views::iota(0, 10000)) | conveyor::batch(64) |
                       std::move(g) | conveyor::unbatch() |
                       conveyor::sink([&](int y) { wrong += y == 2 * next++ + 1 ? 0 : 1; })};
  const conveyor::report r = p.run();
  REQUIRE(r.completed == 10000);
  REQUIRE(wrong == 0);
  REQUIRE(r.lanes.size() == 2);
  REQUIRE(r.lanes[0].device == 0);
  REQUIRE(r.lanes[1].device == 0);
  REQUIRE(r.devices.size() == 1);
}

// ---- cuBLAS -------------------------------------------------------------------------

TEST_CASE("cublas_handle: bound to its stream, with its own workspace") {
  cuda::stream s;
  cuda::cublas_handle blas{s, 4 << 20};
  cudaStream_t bound = nullptr;
  CONVEYOR_CUBLAS_TRY(cublasGetStream(blas.native(), &bound));
  REQUIRE(bound == s.native());
  REQUIRE(blas.bound_stream() == cuda::stream_ref{s});

  // C = A * B with A = [[1, 2], [3, 4]] and B = identity (column-major).
  cuda::pinned_buffer<float> host{12};
  const float values[12] = {1, 3, 2, 4, 1, 0, 0, 1, 0, 0, 0, 0};
  for (int i = 0; i < 12; ++i) host.span()[static_cast<std::size_t>(i)] = values[i];
  cuda::device_buffer<float> dev{12};
  copy_async(dev.span(), host.span(), s);
  const float one = 1.0f, zero = 0.0f;
  CONVEYOR_CUBLAS_TRY(cublasSgemm(blas.native(), CUBLAS_OP_N, CUBLAS_OP_N, 2, 2, 2, &one,
                                  dev.data(), 2, dev.data() + 4, 2, &zero, dev.data() + 8, 2));
  copy_async(host.span().subspan(8, 4), dev.span().subspan(8, 4), s);
  s.synchronize();
  REQUIRE(host.span()[8] == 1.0f);
  REQUIRE(host.span()[9] == 3.0f);
  REQUIRE(host.span()[10] == 2.0f);
  REQUIRE(host.span()[11] == 4.0f);
}

// ---- slot_pool on a device ------------------------------------------------------------

TEST_CASE(
    "slot_pool on a device: a slot is not handed out again before its lane passes the release",
    "[gate]") {
  conveyor::slot_pool<cuda::runtime, int> pool{1, 4, 4};
  cuda::stream lane;
  cuda::pinned_buffer<int> host_flags{3};  // [0] gate, [1] started, [2] result
  for (int& x : host_flags.span()) x = 0;
  int* const f = host_flags.data();
  auto* s = pool.acquire();
  REQUIRE(s != nullptr);
  gpu::launch_spin_until(f + 0, 1, gpu::cycles_for_ms(timeout_ms), f + 1, f + 2, lane.native());
  pool.release(s, lane);
  auto* early = pool.try_acquire();  // the lane is held by the gate: still in use
  const bool pending = (early == nullptr);
  if (early != nullptr) pool.release(early);
  *static_cast<volatile int*>(f + 0) = 1;
  auto* again = pool.acquire();
  REQUIRE(pending);
  REQUIRE(again == s);
  REQUIRE(peek(f + 2) == 1);
  pool.release(again);
}

TEST_CASE("slot_pool on a device: every result is intact when its slot comes back") {
  constexpr std::size_t k = 1 << 16;
  constexpr std::size_t slots = 4;
  conveyor::slot_pool<cuda::runtime, float> pool{slots, k, k};
  const std::uint64_t batches = 2000;
  // per slot index; producers own slots exclusively
  std::vector<std::int64_t> last_batch(slots, -1);
  std::atomic<std::uint64_t> bad{0};
  auto check = [&](const conveyor::slot_pool<cuda::runtime, float>::slot& s) {
    const std::int64_t b = last_batch[s.index];
    if (b < 0) return;
    for (std::size_t j = 0; j < k; j += 97) {
      if (s.pinned_out[j] !=
          3.0f * static_cast<float>((b + static_cast<std::int64_t>(j)) % 4096) + 1.0f) {
        bad.fetch_add(1);
        return;
      }
    }
  };
  {
    cuda::stream lanes[2];
    std::vector<std::thread> producers;
    for (int lane = 0; lane < 2; ++lane) {
      producers.emplace_back([&, lane] {
        const cuda::stream& st = lanes[lane];
        for (std::uint64_t b = static_cast<std::uint64_t>(lane); b < batches; b += 2) {
          auto* s = pool.acquire();
          check(*s);  // the event behind its last use has completed: D2H is done
          for (std::size_t j = 0; j < k; ++j) s->pinned_in[j] = static_cast<float>((b + j) % 4096);
          copy_async(s->device_in, s->pinned_in, st);
          gpu::launch_affine(s->device_in.data(), s->device_out.data(), k, 3.0f, 1.0f, st.native());
          copy_async(s->pinned_out, s->device_out, st);
          last_batch[s->index] = static_cast<std::int64_t>(b);
          pool.release(s, st);
        }
      });
    }
    for (auto& p : producers) p.join();
    std::vector<conveyor::slot_pool<cuda::runtime, float>::slot*> all;
    for (std::size_t i = 0; i < slots; ++i) {
      all.push_back(pool.acquire());
      check(*all.back());
    }
    for (auto* s : all) pool.release(s);
  }
  REQUIRE(bad.load() == 0);
}

// ---- errors -------------------------------------------------------------------------

TEST_CASE("cuda errors: a bad launch surfaces as cuda_error and the last error is cleared") {
  cuda::stream s;
  gpu::launch_invalid_config(s.native());  // 4096 threads in a block
  // Which code a block too large gets is the runtime's to say: this test first expected
  // cudaErrorInvalidConfiguration, and CUDA 13.0 with driver 580 on an H100 gave
  // cudaErrorInvalidValue. So the check is that the macro reports the runtime's own last
  // error, by name and code.
  const cudaError_t expected = cudaPeekAtLastError();  // peek: leaves it for the macro
  REQUIRE(expected != cudaSuccess);
  const std::string name = cudaGetErrorName(expected);
  const int line = __LINE__ + 2;
  try {
    CONVEYOR_CUDA_TRY(cudaPeekAtLastError());  // peek: only the macro may clear it
    FAIL("an invalid launch configuration was accepted");
  } catch (const conveyor::cuda_error& e) {
    CHECK(e.api() == "cudaPeekAtLastError");
    CHECK(e.code() == static_cast<int>(expected));
    CHECK(e.code_name() == name);
    CHECK(e.line() == line);
    CHECK_THAT(std::string(e.file()), Catch::EndsWith("test_cuda_runtime.cpp"));
    CHECK_THAT(std::string(e.what()),
               Catch::Contains(name + " (" + std::to_string(static_cast<int>(expected)) + ")"));
  }
  REQUIRE(cudaPeekAtLastError() == cudaSuccess);
  // Not a sticky error: the stream and the device still work.
  cuda::device_buffer<int> d{1};
  memset_async(d.span(), 0, s);
  s.synchronize();
}

TEST_CASE("cuda device: asking for a device that is not there says how many are") {
  const int n = cuda::device_count();
  REQUIRE(n >= 1);
  cuda::require_device(n - 1);
  REQUIRE_THROWS_WITH(cuda::require_device(n),
                      Catch::Contains("device " + std::to_string(n) + " requested but only " +
                                      std::to_string(n) + " present"));
  REQUIRE_THROWS_AS(cuda::require_device(-1), conveyor::config_error);
  const int before = cuda::current_device();
  {
    cuda::device_guard on{n - 1};
    REQUIRE(cuda::current_device() == n - 1);
  }
  REQUIRE(cuda::current_device() == before);
}
