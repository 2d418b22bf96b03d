// nvtx_range: compiles and runs both ways. Built twice: against conveyor::conveyor
// (no CUDA: an empty object) and, when the toolkit is there, against conveyor::cuda
// (NVTX3 calls into the "conveyor" domain; with no profiler attached they are no-ops,
// so this runs on machines without a GPU).
#include "conveyor/counters/nvtx.hpp"

#include <catch2/catch.hpp>

#include <thread>
#include <type_traits>
#include <vector>

namespace m = conveyor::metrics;

TEST_CASE("nvtx_range: enabled exactly when built against CUDA") {
  STATIC_REQUIRE(m::nvtx_enabled == (CONVEYOR_HAS_CUDA != 0));
  STATIC_REQUIRE(std::is_nothrow_constructible_v<m::nvtx_range, const char*>);
  STATIC_REQUIRE(std::is_nothrow_destructible_v<m::nvtx_range>);
  STATIC_REQUIRE(!std::is_copy_constructible_v<m::nvtx_range>);
#if !CONVEYOR_HAS_CUDA
  STATIC_REQUIRE(std::is_empty_v<m::nvtx_range>);
#endif
}

TEST_CASE("nvtx_range: nested ranges on several threads push and pop") {
  int work = 0;
  {
    m::nvtx_range outer{"stage normalize"};
    for (int i = 0; i < 100; ++i) {
      m::nvtx_range inner{"H2D"};
      ++work;
    }
  }
  std::vector<std::thread> ts;
  for (int t = 0; t < 4; ++t)
    ts.emplace_back([] {
      for (int i = 0; i < 1000; ++i) {
        m::nvtx_range r{"compute"};
      }
    });
  for (auto& t : ts) t.join();
  REQUIRE(work == 100);
}
