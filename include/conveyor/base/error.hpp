// conveyor/base/error.hpp: the exceptions conveyor throws.
//
//   try { pipe.run(); }
//   catch (const conveyor::stage_error& e) {       // which stage, which item
//     std::cerr << e.what();                       // "stage 'normalize' failed on item 17: ..."
//     try { e.rethrow_nested(); } catch (const conveyor::cuda_error& ce) { ce.code(); }
//   }
//
// error            base of everything conveyor throws (a std::runtime_error)
// config_error     bad configuration, thrown at construction; the message says what to change
// cuda_error       a failed CUDA or cuBLAS call: api name, numeric code and its name, file:line
// closed_error     an operation on a closed ring or a stopped pipeline
// deadline_error   a service item's deadline passed before a stage took it
// stage_error      a stage threw: wraps the original exception (std::nested_exception)
//                  and names the stage and the item
// Thread-safety: immutable after construction.
#pragma once

#include <cstdint>
#include <exception>
#include <stdexcept>
#include <string>
#include <utility>

namespace conveyor {

class error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class config_error : public error {
 public:
  using error::error;
};

class closed_error : public error {
 public:
  using error::error;
};

// What the future or callback of an item submitted with a deadline gets when the
// deadline passed before the next stage took it (or before the service had room for it).
class deadline_error : public error {
 public:
  using error::error;
};

class cuda_error : public error {
 public:
  cuda_error(std::string api, int code, std::string code_name, const std::string& message,
             const char* file, int line)
      : error(format(api, code, code_name, message, file, line)),
        api_(std::move(api)),
        code_name_(std::move(code_name)),
        file_(file),
        code_(code),
        line_(line) {}

  const std::string& api() const noexcept { return api_; }
  int code() const noexcept { return code_; }
  const std::string& code_name() const noexcept { return code_name_; }
  const char* file() const noexcept { return file_; }
  int line() const noexcept { return line_; }

 private:
  static std::string format(const std::string& api, int code, const std::string& name,
                            const std::string& message, const char* file, int line) {
    return api + " failed: " + name + " (" + std::to_string(code) + "): " + message + " at " +
           file + ":" + std::to_string(line);
  }

  std::string api_;
  std::string code_name_;
  const char* file_;
  int code_;
  int line_;
};

// Thrown by a pipeline's waiting call when a stage failed. The original exception is
// nested: rethrow_nested() (or std::rethrow_if_nested) gives it back with its own type.
class stage_error : public error, public std::nested_exception {
 public:
  static constexpr std::uint64_t no_item = ~std::uint64_t{0};

  // Must be constructed inside a catch block: std::nested_exception captures the
  // exception currently being handled.
  stage_error(std::string stage, std::uint64_t item, const std::string& what)
      : error("stage '" + stage + "' failed" +
              (item == no_item ? std::string{} : " on item " + std::to_string(item)) + ": " + what),
        stage_(std::move(stage)),
        item_(item) {}

  const std::string& stage() const noexcept { return stage_; }
  // Sequence number of the item (source order, from 0) or no_item when the failure
  // was not tied to one item (a batch, a lane, shutdown).
  std::uint64_t item() const noexcept { return item_; }

 private:
  std::string stage_;
  std::uint64_t item_;
};

namespace detail {

// CONVEYOR_EXPECTS's failure: throws config_error with the message and where the check
// is (compiled once, in the library: src/conveyor/error.cpp).
[[noreturn]] void throw_config_error(const char* msg, const char* cond, const char* file, int line);
[[noreturn]] void throw_config_error(const std::string& msg, const char* cond, const char* file,
                                     int line);

}  // namespace detail
}  // namespace conveyor
