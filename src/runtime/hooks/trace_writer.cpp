// ChromeTraceJson (foreman/hooks.hpp): a run's trace spans as a Chrome trace
// file (chrome://tracing, Perfetto), the timeline ProfilerHook writes.
#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "foreman/hooks.hpp"

namespace foreman {

namespace {

using Json = nlohmann::ordered_json;  // keys in the order written

/// `j` as compact JSON (nlohmann-json). Two escapes as this file always wrote
/// them: U+0008 and U+000C as "\u0008" and "\u000c" (nlohmann writes the
/// equivalent "\b" and "\f"). Bytes that are not UTF-8 become U+FFFD
/// (before nlohmann-json they were copied, which made the file invalid JSON).
std::string Dump(const Json& j) {
  const std::string dumped = j.dump(-1, ' ', /*ensure_ascii=*/false, Json::error_handler_t::replace);
  std::string out;
  out.reserve(dumped.size());
  for (std::size_t i = 0; i < dumped.size(); ++i) {
    if (dumped[i] != '\\' || i + 1 == dumped.size()) {
      out.push_back(dumped[i]);
      continue;
    }
    const char next = dumped[++i];  // an escape: its second character
    out += next == 'b' ? "\\u0008" : next == 'f' ? "\\u000c" : std::string{'\\', next};
  }
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
  events.push_back(Dump(Json{{"name", "process_name"},
                             {"ph", "M"},
                             {"pid", 0},
                             {"args", {{"name", absl::StrCat("Foreman step ", step)}}}}));
  for (std::size_t t = 0; t < thread_ids.size(); ++t) {
    events.push_back(Dump(Json{{"name", "thread_name"},
                               {"ph", "M"},
                               {"pid", 0},
                               {"tid", t},
                               {"args", {{"name", absl::StrCat("thread ", t)}}}}));
  }
  for (const TraceEvent& e : metadata.step_stats) {
    events.push_back(Dump(Json{{"name", e.name},
                               {"cat", e.category},
                               {"ph", "X"},
                               {"ts", e.start_us},
                               {"dur", e.duration_us},
                               {"pid", 0},
                               {"tid", tid_of.at(e.thread_id)}}));
  }
  return absl::StrCat("{\"traceEvents\":[\n", absl::StrJoin(events, ",\n"), "\n]}\n");
}

}  // namespace foreman
