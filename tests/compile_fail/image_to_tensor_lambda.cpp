// Must not compile: as image_to_tensor.cpp, with the map's function a lambda.
#include <optional>

#include "conveyor/pipeline.hpp"

namespace {
struct image {
  int pixels = 0;
};
struct tensor {
  float values = 0;
};
}  // namespace

int main() {
  conveyor::pipeline p{conveyor::source([]() -> std::optional<image> { return std::nullopt; }) |
                       conveyor::map([](tensor t) { return static_cast<int>(t.values); }) |
                       conveyor::sink([](int) {})};
  return p.run().completed == 0 ? 0 : 1;
}
