// src/conveyor/json_writer.hpp: a small streaming JSON writer for the report and the trace
// (the library's own compiled code; not installed).
//
//   detail::json_writer j{os};
//   j.begin_object().field("wall_s", 1.5).field("runtime", "host");
//   j.key("stages").begin_array();
//   for (...) j.begin_object().field("name", s.name).end_object();
//   j.end_array().end_object();
//
// Commas are placed by the writer. Strings are escaped; doubles take their shortest
// round-trip form, and non-finite ones (which JSON has no word for) become null.
// Thread-safety: one writer per stream and thread.
#pragma once

#include <charconv>
#include <cmath>
#include <cstdint>
#include <ostream>
#include <string_view>
#include <type_traits>
#include <vector>

namespace conveyor::detail {

class json_writer {
 public:
  explicit json_writer(std::ostream& os) : os_(os) {}

  json_writer& begin_object() { return open('{'); }
  json_writer& end_object() { return close('}'); }
  json_writer& begin_array() { return open('['); }
  json_writer& end_array() { return close(']'); }

  json_writer& key(std::string_view k) {
    separate();
    string(k);
    os_.put(':');
    after_key_ = true;
    return *this;
  }

  json_writer& value(std::string_view s) {
    return element([&] { string(s); });
  }
  json_writer& value(const char* s) { return value(std::string_view{s}); }
  json_writer& value(double v) {
    return element([&] { number(v); });
  }
  json_writer& value(bool b) {
    return element([&] { os_ << (b ? "true" : "false"); });
  }
  json_writer& null() {
    return element([&] { os_ << "null"; });
  }
  // Integers of any width and sign, exactly.
  template <class I>
    requires(std::is_integral_v<I> && !std::is_same_v<I, bool>)
  json_writer& value(I v) {
    return element([&] { integer(v); });
  }
  // Nanoseconds as microseconds with exactly three decimals (the trace's time unit),
  // without floating point.
  json_writer& microseconds(std::int64_t ns) {
    return element([&] {
      const std::uint64_t mag =
          ns < 0 ? 0 - static_cast<std::uint64_t>(ns) : static_cast<std::uint64_t>(ns);
      if (ns < 0) os_.put('-');
      integer(mag / 1000);
      const auto frac = static_cast<unsigned>(mag % 1000);
      const char digits[4] = {'.', static_cast<char>('0' + frac / 100),
                              static_cast<char>('0' + frac / 10 % 10),
                              static_cast<char>('0' + frac % 10)};
      os_.write(digits, 4);
    });
  }

  template <class V>
  json_writer& field(std::string_view k, const V& v) {
    return key(k).value(v);
  }

  // A line break before the next element (after its comma) or the next closing bracket,
  // for output a person may also read (the trace).
  json_writer& newline() {
    newline_ = true;
    return *this;
  }

 private:
  template <class Write>
  json_writer& element(Write&& write) {
    separate();
    write();
    return *this;
  }
  json_writer& open(char c) {
    separate();
    os_.put(c);
    first_.push_back(true);
    return *this;
  }
  json_writer& close(char c) {
    first_.pop_back();
    line_break();
    os_.put(c);
    return *this;
  }
  // A comma before every element of an object or array but its first; none after a key.
  void separate() {
    if (after_key_) {
      after_key_ = false;
      return;
    }
    if (!first_.empty()) {
      if (!first_.back()) os_.put(',');
      first_.back() = false;
    }
    line_break();
  }
  void line_break() {
    if (newline_) os_.put('\n');
    newline_ = false;
  }

  void string(std::string_view s) {
    static constexpr char hex[] = "0123456789abcdef";
    os_.put('"');
    for (const char ch : s) {
      const auto c = static_cast<unsigned char>(ch);
      switch (c) {
        case '"':
          os_ << "\\\"";
          break;
        case '\\':
          os_ << "\\\\";
          break;
        case '\n':
          os_ << "\\n";
          break;
        case '\r':
          os_ << "\\r";
          break;
        case '\t':
          os_ << "\\t";
          break;
        case '\b':
          os_ << "\\b";
          break;
        case '\f':
          os_ << "\\f";
          break;
        default:
          if (c < 0x20) {
            os_ << "\\u00" << hex[c >> 4] << hex[c & 0xf];
          } else {
            os_.put(ch);  // UTF-8 passes through unchanged
          }
      }
    }
    os_.put('"');
  }
  void number(double v) {
    if (!std::isfinite(v)) {
      os_ << "null";
      return;
    }
    char buf[32];
    const auto r = std::to_chars(buf, buf + sizeof buf, v);
    os_.write(buf, r.ptr - buf);
  }
  template <class I>
  void integer(I v) {
    char buf[24];
    const auto r = std::to_chars(buf, buf + sizeof buf, v);
    os_.write(buf, r.ptr - buf);
  }

  std::ostream& os_;
  std::vector<bool> first_;  // per open object/array: no element written yet
  bool after_key_ = false;
  bool newline_ = false;  // newline() asked for a break before what comes next
};

}  // namespace conveyor::detail
