// Must not compile: a service pipeline (input<T>()) that ends in a sink; its results go
// back through submit().
#include "conveyor/pipeline.hpp"

int main() {
  conveyor::pipeline svc{conveyor::input<int>() | conveyor::map([](int x) { return x + 1; }) |
                         conveyor::sink([](int) {})};
  (void)svc;
}
