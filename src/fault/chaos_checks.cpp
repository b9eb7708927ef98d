// `foreman chaos`'s invariant checks (chaos_checks.hpp).
#include "fault/chaos_checks.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <set>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "foreman/bundle.hpp"
#include "foreman/checkpoint.hpp"
#include "foreman/event_reader.hpp"
#include "foreman/tensor.hpp"

namespace foreman::internal {
namespace {

// "a, b, c, d, e and 3 more"
std::string FirstFew(const std::vector<std::string>& items, std::size_t n = 5) {
  if (items.size() <= n) return absl::StrJoin(items, ", ");
  std::vector<std::string> head(items.begin(), items.begin() + static_cast<std::ptrdiff_t>(n));
  return absl::StrCat(absl::StrJoin(head, ", "), " and ", items.size() - n, " more");
}

std::string Basename(const std::string& path) {
  const std::size_t slash = path.rfind('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

bool SameTensor(const Tensor& a, const Tensor& b) {
  if (a.dtype() != b.dtype() || !(a.shape() == b.shape())) return false;
  if (a.dtype() == DataType::kString) {
    const std::string* x = a.data<std::string>();
    const std::string* y = b.data<std::string>();
    for (int64_t i = 0; i < a.num_elements(); ++i) {
      if (x[i] != y[i]) return false;
    }
    return true;
  }
  return a.TotalBytes() == b.TotalBytes() && std::memcmp(a.raw_data(), b.raw_data(), a.TotalBytes()) == 0;
}

}  // namespace

Status VerifyListedCheckpoints(Env* env, const std::string& dir) {
  std::vector<std::string> bad;
  auto state = ReadCheckpointState(env, dir);
  if (!state.ok()) {
    bad.push_back(absl::StrCat("the state file does not read: ", state.status().message()));
  } else if (state->has_value()) {
    std::vector<std::string> prefixes = (*state)->all_model_checkpoint_paths;
    if (std::find(prefixes.begin(), prefixes.end(), (*state)->model_checkpoint_path) == prefixes.end()) {
      prefixes.push_back((*state)->model_checkpoint_path);
    }
    for (const std::string& listed : prefixes) {
      const std::string prefix = ResolveCheckpointPath(dir, listed);
      auto reader = BundleReader::Open(env, prefix);
      Status s = reader.ok() ? (*reader)->VerifyAll() : reader.status();
      if (!s.ok()) bad.push_back(absl::StrCat(Basename(prefix), ": ", s.message()));
    }
  }
  auto latest = LatestCheckpoint(env, dir);
  if (!latest.ok()) bad.push_back(absl::StrCat("no checkpoint to restore: ", latest.status().message()));
  if (bad.empty()) return absl::OkStatus();
  return absl::DataLossError(absl::StrJoin(bad, "; "));
}

StatusOr<int64_t> LatestCheckpointStep(Env* env, const std::string& dir) {
  FOREMAN_ASSIGN_OR_RETURN(std::optional<std::string> latest, LatestCheckpoint(env, dir));
  if (!latest.has_value()) return int64_t{-1};
  const std::size_t dash = latest->rfind('-');
  int64_t step = 0;
  if (dash == std::string::npos || !absl::SimpleAtoi(latest->substr(dash + 1), &step)) {
    return absl::InvalidArgumentError(absl::StrCat(*latest, ": no -<global_step> at the end of the prefix"));
  }
  return step;
}

Status CompareFinalWeights(Env* env, const std::string& expected_dir, const std::string& actual_dir) {
  FOREMAN_ASSIGN_OR_RETURN(std::optional<std::string> expected, LatestCheckpoint(env, expected_dir));
  FOREMAN_ASSIGN_OR_RETURN(std::optional<std::string> actual, LatestCheckpoint(env, actual_dir));
  if (!expected.has_value()) return absl::FailedPreconditionError("the fault-free run left no checkpoint");
  if (!actual.has_value()) return absl::FailedPreconditionError("the run left no checkpoint");
  FOREMAN_ASSIGN_OR_RETURN(auto want, BundleReader::Open(env, *expected));
  FOREMAN_ASSIGN_OR_RETURN(auto got, BundleReader::Open(env, *actual));
  std::vector<std::string> missing, extra, differ;
  std::set<std::string> got_names;
  for (const BundleEntry& e : got->entries()) got_names.insert(e.name);
  for (const BundleEntry& e : want->entries()) {
    if (got_names.erase(e.name) == 0) {
      missing.push_back(e.name);
      continue;
    }
    FOREMAN_ASSIGN_OR_RETURN(Tensor a, want->Lookup(e.name));
    FOREMAN_ASSIGN_OR_RETURN(Tensor b, got->Lookup(e.name));
    if (!SameTensor(a, b)) differ.push_back(e.name);
  }
  extra.assign(got_names.begin(), got_names.end());
  if (missing.empty() && extra.empty() && differ.empty()) return absl::OkStatus();
  std::vector<std::string> parts;
  if (!differ.empty()) parts.push_back(absl::StrCat("differ: ", FirstFew(differ)));
  if (!missing.empty()) parts.push_back(absl::StrCat("missing: ", FirstFew(missing)));
  if (!extra.empty()) parts.push_back(absl::StrCat("not in the fault-free run's: ", FirstFew(extra)));
  return absl::FailedPreconditionError(absl::StrCat(Basename(*actual), " against the fault-free ",
                                                    Basename(*expected), ": ", absl::StrJoin(parts, "; ")));
}

namespace {

// The events of `logdir`'s event files in TensorBoard's reading order, and
// the file each came from (an index into `files`).
struct RunEvents {
  std::vector<std::string> files;
  std::vector<Event> events;
  std::vector<std::size_t> file_of;
};

StatusOr<RunEvents> ReadRunEvents(Env* env, const std::string& logdir) {
  RunEvents run;
  FOREMAN_ASSIGN_OR_RETURN(run.files, ListEventFiles(env, logdir));
  for (std::size_t f = 0; f < run.files.size(); ++f) {
    FOREMAN_ASSIGN_OR_RETURN(std::vector<Event> events,
                             ReadEventFile(env, run.files[f], /*allow_truncated_tail=*/true));
    run.events.insert(run.events.end(), events.begin(), events.end());
    run.file_of.resize(run.events.size(), f);
  }
  return run;
}

}  // namespace

Status CheckScalarsOnce(Env* env, const std::string& dir) {
  std::vector<std::string> duplicates;
  for (const std::string& logdir : {dir, dir + "/eval"}) {
    if (!env->FileExists(logdir).ok()) continue;
    FOREMAN_ASSIGN_OR_RETURN(RunEvents run, ReadRunEvents(env, logdir));
    std::set<std::pair<std::string, int64_t>> seen;  // (tag, step) TensorBoard shows
    for (std::size_t i : EventsKeptAfterPurge(run.events)) {
      const Event& e = run.events[i];
      if (e.kind != Event::Kind::kSummary) continue;
      for (const SummaryValue& v : e.values) {
        if (v.kind != SummaryValue::Kind::kScalar && v.kind != SummaryValue::Kind::kTensor) continue;
        if (!seen.emplace(v.tag, e.step).second) {
          duplicates.push_back(absl::StrCat(logdir == dir ? "" : "eval: ", v.tag, " at step ", e.step, " (",
                                            Basename(run.files[run.file_of[i]]), ")"));
        }
      }
    }
  }
  if (duplicates.empty()) return absl::OkStatus();
  return absl::FailedPreconditionError(
      absl::StrCat("scalars TensorBoard would show twice: ", FirstFew(duplicates)));
}

StatusOr<std::vector<RecoveryMetrics>> ReadRecoveryMetrics(Env* env, const std::string& dir) {
  if (!env->FileExists(dir).ok()) return std::vector<RecoveryMetrics>{};
  FOREMAN_ASSIGN_OR_RETURN(RunEvents run, ReadRunEvents(env, dir));
  std::map<int64_t, RecoveryMetrics> kept;  // by step: the last one TensorBoard shows at a step
  for (std::size_t i : EventsKeptAfterPurge(run.events)) {
    const Event& e = run.events[i];
    if (e.kind != Event::Kind::kSummary) continue;
    bool any = false;
    RecoveryMetrics m;
    m.step = e.step;
    for (const SummaryValue& v : e.values) {
      const auto ms = static_cast<int64_t>(std::llround(v.scalar * 1000));
      const auto n = static_cast<int64_t>(std::llround(v.scalar));
      if (v.tag == "recovery/detect_secs") {
        m.detect_ms = ms;
      } else if (v.tag == "recovery/restore_secs") {
        m.restore_ms = ms;
      } else if (v.tag == "recovery/next_good_step_secs") {
        m.next_good_step_ms = ms;
      } else if (v.tag == "recovery/steps_lost") {
        m.steps_lost = n;
      } else if (v.tag == "recovery/recoveries") {
        m.recoveries = n;
      } else {
        continue;
      }
      any = true;
    }
    if (any) kept[e.step] = m;
  }
  std::vector<RecoveryMetrics> out;
  for (const auto& [step, m] : kept) out.push_back(m);
  return out;
}

namespace {

int64_t IntField(const nlohmann::json& e, const char* key, int64_t otherwise = -1) {
  const auto it = e.find(key);
  return it != e.end() && it->is_number_integer() ? it->get<int64_t>() : otherwise;
}

std::string StringField(const nlohmann::json& e, const char* key) {
  const auto it = e.find(key);
  return it != e.end() && it->is_string() ? it->get<std::string>() : std::string();
}

// Whether a recovery event that restored `step` - 1 follows `at` before the
// next step event: the step event at `at` is the first good step on the
// restored session (RecoveryOptions::on_recovered is called after it).
bool RecoveredTo(const std::vector<nlohmann::json>& record, std::size_t at, int64_t step) {
  for (std::size_t i = at + 1; i < record.size(); ++i) {
    const std::string event = StringField(record[i], "event");
    if (event == "recovery") return IntField(record[i], "restored_global_step") == step - 1;
    if (event == "step") return false;
  }
  return false;
}

}  // namespace

TrainLog ParseTrainLog(const std::vector<nlohmann::json>& record, const std::string& log_text) {
  TrainLog log;
  bool started = false;
  int64_t current = 0;
  int64_t latest_saved = -1;  // the latest durable checkpoint's step
  for (std::size_t i = 0; i < record.size(); ++i) {
    const nlohmann::json& e = record[i];
    const std::string event = StringField(e, "event");
    if (event == "restore") {
      const int64_t step = IntField(e, "global_step");
      if (step < 0) continue;
      started = true;
      log.restored_step = step;
      current = step;
      log.last_step = current;
    } else if (event == "step") {
      const int64_t step = IntField(e, "global_step");
      if (step < 0) continue;
      if (!started) {  // a fresh start: global_step 0
        started = true;
        current = 0;
      }
      if (step != current + 1 && !RecoveredTo(record, i, step)) {
        log.step_errors.push_back(absl::StrCat("step ", step, " reported after step ", current));
      }
      current = step;
      log.last_step = current;
    } else if (event == "save") {
      const int64_t step = IntField(e, "global_step");
      if (!started && step == 0) {  // a fresh start
        started = true;
        current = 0;
        log.last_step = 0;
      }
      latest_saved = std::max(latest_saved, step);
    } else if (event == "recovery") {
      ++log.recoveries;
      log.recovery_steps_lost += std::max<int64_t>(0, IntField(e, "steps_lost", 0));
      const int64_t restored = IntField(e, "restored_global_step");
      const int64_t before = IntField(e, "global_step_before");
      if (restored < 0) continue;
      if (before >= 0 && restored > before) {
        log.step_errors.push_back(absl::StrCat("a recovery restored step ", restored, " after step ", before));
      } else if (latest_saved > restored) {
        // A failed save ends the run (it is no preemption), and a recovery
        // waits for the saves in flight: the last one saved is the latest.
        log.step_errors.push_back(absl::StrCat("a recovery restored step ", restored,
                                               ", but the latest checkpoint is step ", latest_saved));
      }
    } else if (event == "injected_stop") {
      log.stopped_by_fault = StringField(e, "fault");
    } else if (event == "exit") {
      log.stopped_by_signal = !StringField(e, "stopped_by_signal").empty();
    }
  }
  // Under --restart-policy: `foreman train`'s report lines on stdout.
  for (absl::string_view line : absl::StrSplit(log_text, '\n')) {
    if (!absl::StartsWith(line, "service restart ")) continue;
    const std::size_t colon = line.find(": ");
    if (colon == absl::string_view::npos) continue;
    log.service_restarts.emplace_back(line.substr(colon + 2));
    constexpr absl::string_view kLost = "summary steps lost: [";
    if (const std::size_t at = line.find(kLost); at != absl::string_view::npos) {
      absl::string_view list = line.substr(at + kLost.size());
      list = list.substr(0, list.find(']'));
      for (absl::string_view n : absl::StrSplit(list, ", ", absl::SkipEmpty())) {
        int64_t step = 0;
        if (absl::SimpleAtoi(n, &step)) log.summary_steps_lost.push_back(step);
      }
    }
  }
  return log;
}

const std::vector<std::string>& InvariantNames() {
  static const std::vector<std::string> names = {"checkpoints_verify", "global_step", "final_weights",
                                                 "scalars_once",       "bounded",     "finished"};
  return names;
}

std::string InvariantCell(const Invariant& i) { return !i.ok ? "FAIL" : i.checked ? "ok" : "-"; }

std::string FailedSeedText(int64_t seed, const std::map<std::string, Invariant>& invariants,
                           const std::string& runs_line, const std::string& work_dir, const std::string& replay) {
  std::string out = absl::StrFormat("\nseed %lld FAILED:\n", static_cast<long long>(seed));
  for (const std::string& name : InvariantNames()) {
    const Invariant& i = invariants.at(name);
    if (i.ok) continue;
    for (const std::string& d : i.details) absl::StrAppendFormat(&out, "  %s: %s\n", name, d);
  }
  absl::StrAppendFormat(&out, "%s\n  logs: %s/seed-%lld\n  replay: %s\n", runs_line, work_dir,
                        static_cast<long long>(seed), replay);
  return out;
}

bool HasFlag(const std::vector<std::string>& flags, const std::string& name) {
  for (const std::string& f : flags) {
    if (f == name || absl::StartsWith(f, name + "=")) return true;
  }
  return false;
}

std::string ShellQuote(const std::string& s) {
  if (!s.empty() && s.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_=.,/:+@%") ==
                        std::string::npos) {
    return s;
  }
  return absl::StrCat("'", absl::StrReplaceAll(s, {{"'", "'\\''"}}), "'");
}

int64_t MillisSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace foreman::internal
