// conveyor/counters/nvtx.hpp: NVTX ranges in a "conveyor" domain, so Nsight Systems shows
// the same stage and lane-phase names as the Chrome trace. Nothing without CUDA.
//
//   {
//     conveyor::metrics::nvtx_range r{"normalize"};   // push now, pop at scope exit
//     run_stage_body();
//   }
//
// With CONVEYOR_HAS_CUDA (the conveyor::cuda target) this uses NVTX3, which is
// header-only: with no profiler attached each push/pop is a call through a null
// function pointer and costs a few ns. Without CUDA, nvtx_range is an empty object and
// both calls compile to nothing. `name` must stay valid until the range ends.
//
// Thread-safety: any thread; ranges nest per thread (push/pop on the calling thread),
// so a range must end on the thread that began it (RAII guarantees it).
#pragma once

#include "conveyor/base/config.hpp"
#if CONVEYOR_HAS_CUDA
#include <nvtx3/nvToolsExt.h>  // header-only NVTX3, from the CUDA toolkit (CUDA::nvtx3)
#endif

#if CONVEYOR_HAS_CUDA
namespace conveyor::detail {
inline nvtxDomainHandle_t nvtx_domain() noexcept {
  static const nvtxDomainHandle_t d = nvtxDomainCreateA("conveyor");  // once, thread-safe
  return d;
}
}  // namespace conveyor::detail
#endif

namespace conveyor::metrics {

// True when ranges reach NVTX (built against conveyor::cuda).
inline constexpr bool nvtx_enabled = CONVEYOR_HAS_CUDA != 0;

class nvtx_range {
 public:
  explicit nvtx_range([[maybe_unused]] const char* name) noexcept {
#if CONVEYOR_HAS_CUDA
    nvtxEventAttributes_t a{};
    a.version = NVTX_VERSION;
    a.size = NVTX_EVENT_ATTRIB_STRUCT_SIZE;
    a.messageType = NVTX_MESSAGE_TYPE_ASCII;
    a.message.ascii = name;
    nvtxDomainRangePushEx(::conveyor::detail::nvtx_domain(), &a);
#endif
  }
  ~nvtx_range() {
#if CONVEYOR_HAS_CUDA
    nvtxDomainRangePop(::conveyor::detail::nvtx_domain());
#endif
  }
  nvtx_range(const nvtx_range&) = delete;
  nvtx_range& operator=(const nvtx_range&) = delete;
};

}  // namespace conveyor::metrics
