// Built only when the package exports conveyor::cuda: linking it must define
// CONVEYOR_HAS_CUDA=1 for a plain C++ translation unit.
#include <conveyor/base/config.hpp>

static_assert(CONVEYOR_HAS_CUDA == 1, "linking conveyor::cuda must define CONVEYOR_HAS_CUDA=1");

int main() { return 0; }
