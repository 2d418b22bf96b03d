// Must compile (positive control for the compile-fail cases): the same shapes as the
// failing cases, connected correctly, under the project's warning flags.
#include <optional>
#include <vector>

#include "conveyor/pipeline.hpp"

namespace {
struct image {
  int pixels = 0;
};
struct tensor {
  float values = 0;
};
std::optional<image> next_image() { return std::nullopt; }
tensor to_tensor(image im) { return tensor{static_cast<float>(im.pixels)}; }
int classify(tensor t) { return static_cast<int>(t.values); }
}  // namespace

int main() {
  conveyor::pipeline p{conveyor::source(next_image) | conveyor::map(to_tensor) |
                       conveyor::batch(4) | conveyor::map([](std::vector<tensor> v) { return v; }) |
                       conveyor::unbatch() | conveyor::map(classify) | conveyor::sink([](int) {})};
  conveyor::pipeline svc{conveyor::input<image>() | conveyor::map(to_tensor) |
                         conveyor::map([](tensor t) { return classify(t); })};
  svc.start();
  // cf. submit_done_not_noexcept
  svc.submit(image{}, [](conveyor::outcome<int> r) noexcept { (void)r; });
  (void)svc.stop(conveyor::stop_mode::drain);
  return p.run().completed == 0 ? 0 : 1;
}
