// `foreman chaos`'s invariant checks (chaos_checks.hpp).
#include "fault/chaos_checks.hpp"

#include <cmath>
#include <cstring>
#include <map>
#include <set>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
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

// The number after "<what>" in `line` (digits only), or nullopt.
std::optional<int64_t> NumberAfter(absl::string_view line, absl::string_view what) {
  const std::size_t at = line.find(what);
  if (at == absl::string_view::npos) return std::nullopt;
  absl::string_view rest = line.substr(at + what.size());
  std::size_t n = 0;
  while (n < rest.size() && rest[n] >= '0' && rest[n] <= '9') ++n;
  int64_t value = 0;
  if (n == 0 || !absl::SimpleAtoi(rest.substr(0, n), &value)) return std::nullopt;
  return value;
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

TrainLog ParseTrainLog(const std::string& text) {
  TrainLog log;
  bool started = false;
  int64_t current = 0;
  int64_t last_saved = -1;  // the step of the last "Saving checkpoints for <n> into" line
  int64_t saved_before = -1;  // the one before it (a restarted saver may lose the last)
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    if (absl::StartsWith(line, "service restart ")) {
      const std::size_t colon = line.find(": ");
      if (colon != absl::string_view::npos) {
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
      continue;
    }
    // A save lost with a checkpoint_saver that the restart policy restarted
    // (CheckpointSaverHook's WARNING): the latest checkpoint is the one before.
    if (auto lost = NumberAfter(line, "The checkpoint of step "); lost && absl::StrContains(line, " was lost")) {
      if (*lost == last_saved) last_saved = saved_before;
      continue;
    }
    if (absl::StrContains(line, "Restoring parameters from ")) {
      // The number is in the prefix's "-<step>" suffix: take the last one.
      const std::size_t dash = line.rfind('-');
      int64_t step = 0;
      if (dash == absl::string_view::npos || !absl::SimpleAtoi(line.substr(dash + 1), &step)) continue;
      if (!started) {
        started = true;
        log.restored_step = step;
      } else if (step > current) {
        log.step_errors.push_back(absl::StrCat("a recovery restored step ", step, " after step ", current));
      } else if (last_saved >= 0 && step != last_saved) {
        // A failed save ends the run (it is no preemption), and a recovery
        // waits for the saves in flight: the last one saved is the latest.
        log.step_errors.push_back(absl::StrCat("a recovery restored step ", step, ", but the latest checkpoint is step ",
                                               last_saved));
      }
      current = step;
      log.last_step = current;
      continue;
    }
    if (absl::StrContains(line, "Recovered from a preemption error")) {
      ++log.recoveries;
      if (auto lost = NumberAfter(line, " restored; ")) log.recovery_steps_lost += *lost;
      continue;
    }
    if (absl::StartsWith(line, "step ")) {
      auto step = NumberAfter(line, "step ");
      if (!step.has_value()) continue;
      if (!started) {  // a fresh start: global_step 0
        started = true;
        current = 0;
      }
      if (*step != current + 1) {
        log.step_errors.push_back(absl::StrCat("step ", *step, " reported after step ", current));
      }
      current = *step;
      log.last_step = current;
      continue;
    }
    if (auto saved = NumberAfter(line, "Saving checkpoints for ")) {
      saved_before = last_saved;
      last_saved = *saved;
    }
    if (absl::StrContains(line, "Saving checkpoints for 0 into") && !started) {
      started = true;  // a fresh start
      current = 0;
      log.last_step = 0;
      continue;
    }
    constexpr absl::string_view kStoppedBy = "stopped by injected fault ";
    if (const std::size_t at = line.find(kStoppedBy); at != absl::string_view::npos) {
      absl::string_view id = line.substr(at + kStoppedBy.size());
      id = id.substr(0, id.find(':'));
      log.stopped_by_fault = std::string(id);
      continue;
    }
    if (absl::StartsWith(line, "stopped by ") && absl::StrContains(line, "after its final checkpoint")) {
      log.stopped_by_signal = true;
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
