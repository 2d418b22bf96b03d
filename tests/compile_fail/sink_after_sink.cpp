// Must not compile: a sink produces nothing, so nothing (here another sink) can follow it.
#include <optional>

#include "conveyor/pipeline.hpp"

int main() {
  auto chain = conveyor::source([]() -> std::optional<int> { return std::nullopt; }) |
               conveyor::sink([](int) {}) | conveyor::sink([](int) {});
  (void)chain;
}
