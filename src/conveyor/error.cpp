// src/conveyor/error.cpp: the failure paths of CONVEYOR_EXPECTS (conveyor/base/error.hpp)
// and of the runtime spans' checked access (conveyor/runtime/detail/memory_span.hpp).
#include "conveyor/base/error.hpp"

#include <string>

#include "conveyor/runtime/detail/memory_span.hpp"

namespace conveyor::detail {

void throw_config_error(const char* msg, const char* cond, const char* file, int line) {
  throw config_error(std::string(msg) + " [check '" + cond + "' failed at " + file + ":" +
                     std::to_string(line) + "]");
}

void throw_config_error(const std::string& msg, const char* cond, const char* file, int line) {
  throw_config_error(msg.c_str(), cond, file, line);
}

void throw_outside_span(std::size_t offset, std::size_t count, std::size_t size) {
  throw config_error("a write or read of " + std::to_string(count) + " element(s) at index " +
                     std::to_string(offset) + " is outside a span of " + std::to_string(size) +
                     " elements; nothing was written. A gpu stage-in span is one slot: raise "
                     "in_elems or use smaller batches");
}

}  // namespace conveyor::detail
