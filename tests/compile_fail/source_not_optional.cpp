// Must not compile: a source function must return std::optional<T> (nullopt ends input).
#include "conveyor/pipeline.hpp"

int main() {
  conveyor::pipeline p{conveyor::source([] { return 1; }) | conveyor::sink([](int) {})};
  return p.run().completed == 0 ? 0 : 1;
}
