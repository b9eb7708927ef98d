// Reading a run record (<run_dir>/run_record.jsonl, foreman/fault.hpp's
// RunRecordWriter has the events). Internal: the chaos invariants' input.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "foreman/env.hpp"
#include "foreman/status.hpp"

namespace foreman::internal {

/// The events of a record's text, in order. A last line without its '\n'
/// that does not parse is a torn write (a killed process) and is skipped;
/// `torn` (may be null) says whether one was. Any other line that is not a
/// JSON object with a string "event": DATA_LOSS "<name>:<line>: ..." (lines
/// counted from 1). Empty lines are skipped.
StatusOr<std::vector<nlohmann::json>> ParseRunRecord(const std::string& text, const std::string& name,
                                                     bool* torn = nullptr);

/// ParseRunRecord of <run_dir>/run_record.jsonl; no events when the file
/// does not exist. The Env's errors otherwise.
StatusOr<std::vector<nlohmann::json>> ReadRunRecord(Env* env, const std::string& run_dir);

/// ParseRunRecord of the record file `path` (`foreman train --run-record`);
/// no events when it does not exist. The Env's errors otherwise.
StatusOr<std::vector<nlohmann::json>> ReadRunRecordFile(Env* env, const std::string& path);

}  // namespace foreman::internal
