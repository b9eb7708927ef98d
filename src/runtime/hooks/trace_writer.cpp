// ChromeTraceJson (foreman/hooks.hpp): a run's trace spans as a Chrome trace
// file (chrome://tracing, Perfetto), the timeline ProfilerHook writes.
#include <cstdint>
#include <cstdio>
#include <string>
#include <unordered_map>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "foreman/hooks.hpp"

namespace foreman {

namespace {

/// A JSON string literal of `s` (UTF-8 passes through unchanged).
std::string JsonString(const std::string& s) {
  std::string out = "\"";
  for (const unsigned char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      default:
        if (c < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof(buf), "\\u%04x", c);
          out += buf;
        } else {
          out.push_back(static_cast<char>(c));
        }
    }
  }
  out += "\"";
  return out;
}

}  // namespace

std::string ChromeTraceJson(const RunMetadata& metadata, int64_t step) {
  std::vector<int64_t> thread_ids;  // original ids, in order of first appearance
  std::unordered_map<int64_t, std::size_t> tid_of;
  for (const TraceEvent& e : metadata.step_stats) {
    if (tid_of.emplace(e.thread_id, thread_ids.size()).second) thread_ids.push_back(e.thread_id);
  }
  std::vector<std::string> events;
  events.push_back(absl::StrCat(R"({"name":"process_name","ph":"M","pid":0,"args":{"name":)",
                                JsonString(absl::StrCat("Foreman step ", step)), "}}"));
  for (std::size_t t = 0; t < thread_ids.size(); ++t) {
    events.push_back(absl::StrCat(R"({"name":"thread_name","ph":"M","pid":0,"tid":)", t, R"(,"args":{"name":)",
                                  JsonString(absl::StrCat("thread ", t)), "}}"));
  }
  for (const TraceEvent& e : metadata.step_stats) {
    events.push_back(absl::StrCat(R"({"name":)", JsonString(e.name), R"(,"cat":)", JsonString(e.category),
                                  R"(,"ph":"X","ts":)", e.start_us, R"(,"dur":)", e.duration_us,
                                  R"(,"pid":0,"tid":)", tid_of.at(e.thread_id), "}"));
  }
  return absl::StrCat("{\"traceEvents\":[\n", absl::StrJoin(events, ",\n"), "\n]}\n");
}

}  // namespace foreman
