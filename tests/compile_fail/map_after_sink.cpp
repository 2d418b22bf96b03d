// Must not compile: a stage placed after a sink.
#include <optional>

#include "conveyor/pipeline.hpp"

int main() {
  auto chain = conveyor::source([]() -> std::optional<int> { return std::nullopt; }) |
               conveyor::sink([](int) {}) | conveyor::map([](int x) { return x; });
  (void)chain;
}
