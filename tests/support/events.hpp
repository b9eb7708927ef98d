// Reading back what a run wrote: every event of a directory's event files,
// and the steps of its session logs and summaries. Shared by the tests.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <doctest/doctest.h>

#include "foreman/env.hpp"
#include "foreman/event_reader.hpp"

namespace foreman::testing {

// Every event of every event file in `dir`, in file order.
inline std::vector<Event> Events(const std::string& dir) {
  std::vector<Event> out;
  auto files = ListEventFiles(Env::Default(), dir);
  if (!files.ok()) return out;
  for (const auto& f : *files) {
    auto events = ReadEventFile(Env::Default(), f);
    REQUIRE_MESSAGE(events.ok(), events.status().ToString());
    out.insert(out.end(), events->begin(), events->end());
  }
  return out;
}

// The steps of the session logs with `status`, in order.
inline std::vector<int64_t> SessionLogSteps(const std::vector<Event>& events, SessionLogStatus status) {
  std::vector<int64_t> steps;
  for (const Event& e : events) {
    if (e.kind == Event::Kind::kSessionLog && e.session_status == status) steps.push_back(e.step);
  }
  return steps;
}

// The steps of the summaries holding a value tagged `tag`, in order.
inline std::vector<int64_t> SummarySteps(const std::vector<Event>& events, const std::string& tag) {
  std::vector<int64_t> steps;
  for (const Event& e : events) {
    if (e.kind != Event::Kind::kSummary) continue;
    for (const SummaryValue& v : e.values) {
      if (v.tag == tag) steps.push_back(e.step);
    }
  }
  return steps;
}

// How many values tagged `tag` TensorBoard keeps at each step under its
// purge rule (B154, EventsKeptAfterPurge): a SessionLog START at step s
// discards the events read before it whose step is >= s.
inline std::map<int64_t, int> KeptAfterPurge(const std::vector<Event>& events, const std::string& tag) {
  std::map<int64_t, int> kept;
  for (std::size_t i : EventsKeptAfterPurge(events)) {
    for (const SummaryValue& v : events[i].values) {
      if (v.tag == tag) ++kept[events[i].step];
    }
  }
  return kept;
}

}  // namespace foreman::testing
