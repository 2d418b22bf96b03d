// Must not compile: unbatch() after a stage whose output is not a std::vector.
#include <optional>

#include "conveyor/pipeline.hpp"

int main() {
  conveyor::pipeline p{conveyor::source([]() -> std::optional<int> { return std::nullopt; }) |
                       conveyor::unbatch() | conveyor::sink([](int) {})};
  return p.run().completed == 0 ? 0 : 1;
}
