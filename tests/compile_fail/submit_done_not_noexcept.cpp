// Must not compile: submit(x, done) with a callback that may throw (it runs on the
// pipeline's threads, where nothing could catch it).
#include "conveyor/pipeline.hpp"

int main() {
  conveyor::pipeline svc{conveyor::input<int>() | conveyor::map([](int x) { return x + 1; })};
  svc.start();
  svc.submit(1, [](conveyor::outcome<int>) {});
  (void)svc.stop(conveyor::stop_mode::drain);
}
