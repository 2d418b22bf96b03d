// Must not compile: a map whose function takes `tensor` placed after a source producing
// `image`. The diagnostic must say "stage type mismatch" and name both types.
#include <optional>

#include "conveyor/pipeline.hpp"

namespace {
struct image {
  int pixels = 0;
};
struct tensor {
  float values = 0;
};
std::optional<image> next_image() { return std::nullopt; }
int classify(tensor t) { return static_cast<int>(t.values); }
}  // namespace

int main() {
  conveyor::pipeline p{conveyor::source(next_image) | conveyor::map(classify) |
                       conveyor::sink([](int) {})};
  return p.run().completed == 0 ? 0 : 1;
}
