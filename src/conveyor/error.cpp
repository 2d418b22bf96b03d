// src/conveyor/error.cpp: CONVEYOR_EXPECTS's failure path (conveyor/base/error.hpp).
#include "conveyor/base/error.hpp"

namespace conveyor::detail {

void throw_config_error(const char* msg, const char* cond, const char* file, int line) {
  throw config_error(std::string(msg) + " [check '" + cond + "' failed at " + file + ":" +
                     std::to_string(line) + "]");
}

void throw_config_error(const std::string& msg, const char* cond, const char* file, int line) {
  throw_config_error(msg.c_str(), cond, file, line);
}

}  // namespace conveyor::detail
