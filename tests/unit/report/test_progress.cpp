// progress_line: refuses fast periods, refreshes with '\r' lines from the snapshot
// function, stops promptly, survives a throwing snapshot.
#include "conveyor/report/progress.hpp"

#include <catch2/catch.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <future>
#include <sstream>
#include <stdexcept>
#include <string>

namespace m = conveyor::metrics;
using namespace std::chrono_literals;

namespace {

m::report fake(std::uint64_t calls) {
  m::report r;
  r.wall_s = static_cast<double>(calls);
  r.produced = r.completed = 1000 * calls;
  m::stage_report s;
  s.name = "read";
  s.kind = m::stage_kind::source;
  s.busy_s = 0.95 * r.wall_s;
  r.stages.push_back(s);
  s.name = "write";
  s.kind = m::stage_kind::sink;
  s.busy_s = 0.1 * r.wall_s;
  s.starved_s = 0.85 * r.wall_s;
  r.stages.push_back(s);
  return r;
}

}  // namespace

TEST_CASE("progress_line: bad configuration throws config_error") {
  std::ostringstream out;
  REQUIRE_THROWS_AS(m::progress_line([] { return m::report{}; }, 100ms, out),
                    conveyor::config_error);
  REQUIRE_THROWS_AS(m::progress_line(m::progress_line::snapshot_fn{}, 500ms, out),
                    conveyor::config_error);
}

TEST_CASE("progress_line: refreshes a single line from snapshots") {
  std::ostringstream out;
  std::atomic<std::uint64_t> calls{0};
  std::promise<void> third;
  {
    m::progress_line p{[&] {
                         const std::uint64_t c = calls.fetch_add(1) + 1;
                         if (c == 3) third.set_value();  // initial snapshot + 2 refreshes
                         return fake(c);
                       },
                       250ms, out};
    third.get_future().wait();  // a gate, not a sleep
    p.stop();
    p.stop();  // idempotent
    REQUIRE(p.refreshes() >= 2);
    REQUIRE(p.refreshes() + 1 == calls.load());
  }
  const std::string s = out.str();
  INFO(s);
  REQUIRE(std::count(s.begin(), s.end(), '\r') == static_cast<long>(calls.load() - 1));
  REQUIRE(s.find("items/s") != std::string::npos);
  REQUIRE(s.find("1000.0 items/s") != std::string::npos);  // 1000 items per 1 s window
  REQUIRE(s.find("source_bound 'read'") != std::string::npos);
  REQUIRE(s.back() == '\n');
  REQUIRE(std::count(s.begin(), s.end(), '\n') == 1);
}

TEST_CASE("progress_line: stop() wakes the thread before its period ends") {
  std::ostringstream out;
  std::atomic<int> calls{0};
  m::progress_line p{[&] {
                       calls.fetch_add(1);
                       return fake(1);
                     },
                     std::chrono::milliseconds{3'600'000}, out};  // an hour: only stop() ends it
  p.stop();
  REQUIRE(p.refreshes() == 0);
  REQUIRE(out.str().empty());
}

TEST_CASE("progress_line: a throwing snapshot ends the line quietly") {
  std::ostringstream out;
  std::atomic<int> calls{0};
  std::promise<void> thrown;
  m::progress_line p{[&]() -> m::report {
                       if (calls.fetch_add(1) == 1) {
                         thrown.set_value();
                         throw std::runtime_error("snapshot failed");
                       }
                       return fake(1);
                     },
                     250ms, out};
  thrown.get_future().wait();
  p.stop();
  REQUIRE(p.refreshes() == 0);
  REQUIRE(calls.load() == 2);
}
