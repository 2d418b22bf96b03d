// conveyor/report/detail/json.hpp: the few JSON writing helpers the trace exporter and
// report::to_json share (hand-written output, no dependency).
//
//   detail::json_string(os, name);     // "quoted, \"escaped\""
//   detail::json_number(os, 0.25);     // shortest round-trip form; NaN/inf -> null
//   detail::json_us(os, 1234567);      // 1234.567 (ns -> us, exact, 3 decimals)
//
// Thread-safety: stateless functions.
#pragma once

#include <charconv>
#include <cmath>
#include <cstdint>
#include <ostream>
#include <string_view>
#include <system_error>

namespace conveyor::detail {

inline void json_string(std::ostream& os, std::string_view s) {
  static constexpr char hex[] = "0123456789abcdef";
  os.put('"');
  for (const char ch : s) {
    const auto c = static_cast<unsigned char>(ch);
    switch (c) {
      case '"': os << "\\\""; break;
      case '\\': os << "\\\\"; break;
      case '\n': os << "\\n"; break;
      case '\r': os << "\\r"; break;
      case '\t': os << "\\t"; break;
      case '\b': os << "\\b"; break;
      case '\f': os << "\\f"; break;
      default:
        if (c < 0x20) {
          os << "\\u00" << hex[c >> 4] << hex[c & 0xf];
        } else {
          os.put(ch);  // UTF-8 passes through unchanged
        }
    }
  }
  os.put('"');
}

// Shortest representation that parses back to the same double; JSON has no NaN/inf.
inline void json_number(std::ostream& os, double v) {
  if (!std::isfinite(v)) {
    os << "null";
    return;
  }
  char buf[32];
  const auto r = std::to_chars(buf, buf + sizeof buf, v);
  os.write(buf, r.ptr - buf);
}

inline void json_number(std::ostream& os, std::uint64_t v) {
  char buf[24];
  const auto r = std::to_chars(buf, buf + sizeof buf, v);
  os.write(buf, r.ptr - buf);
}

inline void json_number(std::ostream& os, std::int64_t v) {
  char buf[24];
  const auto r = std::to_chars(buf, buf + sizeof buf, v);
  os.write(buf, r.ptr - buf);
}

// Nanoseconds as microseconds with exactly three decimals, without floating point.
inline void json_us(std::ostream& os, std::int64_t ns) {
  std::uint64_t mag = ns < 0 ? 0 - static_cast<std::uint64_t>(ns) : static_cast<std::uint64_t>(ns);
  if (ns < 0) os.put('-');
  json_number(os, mag / 1000);
  const auto frac = static_cast<unsigned>(mag % 1000);
  const char digits[4] = {'.', static_cast<char>('0' + frac / 100),
                          static_cast<char>('0' + frac / 10 % 10), static_cast<char>('0' + frac % 10)};
  os.write(digits, 4);
}

}  // namespace conveyor::detail
