// The MLP job's settings (include/foreman/mlp_job_settings.hpp): one stored
// field per setting, the checks, and a resume's resolution.
#include "foreman/mlp_job_settings.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "foreman/restart_policy.hpp"

namespace foreman {
namespace {

// -- one stored field per setting ------------------------------------------------

std::string ToText(int64_t v) { return std::to_string(v); }
std::string ToText(double v) { return absl::StrFormat("%.17g", v); }
std::string ToText(const std::string& v) { return v; }
template <class T>
std::string ToText(const std::optional<T>& v) {
  return v ? ToText(*v) : "";
}

bool FromText(absl::string_view s, int64_t* out) { return absl::SimpleAtoi(s, out); }
bool FromText(absl::string_view s, double* out) { return absl::SimpleAtod(s, out); }
bool FromText(absl::string_view s, std::string* out) {
  *out = std::string(s);
  return true;
}
template <class T>
bool FromText(absl::string_view s, std::optional<T>* out) {
  if (s.empty()) {
    out->reset();
    return true;
  }
  T v{};
  if (!FromText(s, &v)) return false;
  *out = v;
  return true;
}

struct Field {
  const char* key;
  const char* flag;
  // Model-defining (--hidden, --optimizer, --seed): may not change on resume.
  bool model = false;
  // Schedules given as a pair (secs or steps): giving one drops both stored.
  const char* pair_flag = nullptr;
  std::function<std::string(const MlpJobSettings&)> get;
  std::function<bool(absl::string_view, MlpJobSettings&)> set;
  // The canonical text of a value, for comparing and storing.
  std::function<StatusOr<std::string>(const std::string&)> normalize;
};

template <class T>
Field MakeField(const char* key, const char* flag, T MlpJobSettings::*member) {
  Field f;
  f.key = key;
  f.flag = flag;
  f.get = [member](const MlpJobSettings& flags) { return ToText(flags.*member); };
  f.set = [member](absl::string_view s, MlpJobSettings& flags) { return FromText(s, &(flags.*member)); };
  f.normalize = [](const std::string& s) -> StatusOr<std::string> { return s; };
  return f;
}

const std::vector<Field>& Fields() {
  static const std::vector<Field> fields = [] {
    std::vector<Field> v;
    Field hidden = MakeField("hidden", "--hidden", &MlpJobSettings::hidden);
    hidden.model = true;
    hidden.normalize = [](const std::string& s) -> StatusOr<std::string> {
      FOREMAN_ASSIGN_OR_RETURN(std::vector<int64_t> dims, ParseHiddenLayers(s));
      return dims.empty() ? std::string("none") : absl::StrJoin(dims, ",");
    };
    v.push_back(hidden);
    Field optimizer = MakeField("optimizer", "--optimizer", &MlpJobSettings::optimizer);
    optimizer.model = true;
    optimizer.normalize = [](const std::string& s) -> StatusOr<std::string> {
      FOREMAN_ASSIGN_OR_RETURN(nn::OptimizerKind kind, nn::ParseOptimizerKind(s));
      return nn::OptimizerKindName(kind);
    };
    v.push_back(optimizer);
    Field seed = MakeField("seed", "--seed", &MlpJobSettings::seed);
    seed.model = true;
    seed.normalize = [](const std::string& s) -> StatusOr<std::string> {
      int64_t n = 0;
      if (!absl::SimpleAtoi(s, &n)) return absl::InvalidArgumentError(absl::StrCat("'", s, "' is not a number"));
      return std::to_string(n);
    };
    v.push_back(seed);
    v.push_back(MakeField("batch_size", "--batch-size", &MlpJobSettings::batch_size));
    v.push_back(MakeField("epochs", "--epochs", &MlpJobSettings::epochs));
    v.push_back(MakeField("max_steps", "--max-steps", &MlpJobSettings::max_steps));
    v.push_back(MakeField("threads", "--threads", &MlpJobSettings::threads));
    v.push_back(MakeField("device", "--device", &MlpJobSettings::device));
    v.push_back(
        MakeField("device_memory_limit_mb", "--device-memory-limit-mb", &MlpJobSettings::device_memory_limit_mb));
    v.push_back(MakeField("learning_rate", "--learning-rate", &MlpJobSettings::learning_rate));
    v.push_back(MakeField("learning_rate_decay_steps", "--learning-rate-decay-steps",
                          &MlpJobSettings::learning_rate_decay_steps));
    v.push_back(MakeField("learning_rate_decay_rate", "--learning-rate-decay-rate",
                          &MlpJobSettings::learning_rate_decay_rate));
    v.push_back(MakeField("data_dir", "--data-dir", &MlpJobSettings::data_dir));
    Field ckpt_secs = MakeField("save_checkpoint_secs", "--save-checkpoint-secs", &MlpJobSettings::save_checkpoint_secs);
    ckpt_secs.pair_flag = "--save-checkpoint-steps";
    v.push_back(ckpt_secs);
    Field ckpt_steps =
        MakeField("save_checkpoint_steps", "--save-checkpoint-steps", &MlpJobSettings::save_checkpoint_steps);
    ckpt_steps.pair_flag = "--save-checkpoint-secs";
    v.push_back(ckpt_steps);
    Field sum_steps = MakeField("save_summaries_steps", "--save-summaries-steps", &MlpJobSettings::save_summaries_steps);
    sum_steps.pair_flag = "--save-summaries-secs";
    v.push_back(sum_steps);
    Field sum_secs = MakeField("save_summaries_secs", "--save-summaries-secs", &MlpJobSettings::save_summaries_secs);
    sum_secs.pair_flag = "--save-summaries-steps";
    v.push_back(sum_secs);
    v.push_back(MakeField("log_step_count_steps", "--log-step-count-steps", &MlpJobSettings::log_step_count_steps));
    v.push_back(
        MakeField("stop_grace_period_secs", "--stop-grace-period-secs", &MlpJobSettings::stop_grace_period_secs));
    v.push_back(MakeField("eval_every_steps", "--eval-every-steps", &MlpJobSettings::eval_every_steps));
    v.push_back(MakeField("prefetch_batches", "--prefetch-batches", &MlpJobSettings::prefetch_batches));
    return v;
  }();
  return fields;
}

Status Usage(const std::string& message) { return absl::InvalidArgumentError(message); }

Status CheckPositive(const char* flag, const std::optional<double>& v) {
  if (v && !(*v > 0 && std::isfinite(*v))) {
    return Usage(absl::StrCat(flag, " must be a positive number of seconds, got ", *v));
  }
  return absl::OkStatus();
}

Status CheckPositive(const char* flag, const std::optional<int64_t>& v) {
  if (v && *v < 1) return Usage(absl::StrCat(flag, " must be >= 1, got ", *v));
  return absl::OkStatus();
}

}  // namespace

const char kMlpJobSettingsComment[] =
    "# foreman train: the settings of the run in this directory, read when it resumes: a flag not given\n"
    "# takes its value from here. hidden, optimizer and seed define the model and its data order.\n";

const std::vector<std::string>& MlpJobModelKeys() {
  static const std::vector<std::string> keys = [] {
    std::vector<std::string> v;
    for (const Field& field : Fields()) {
      if (field.model) v.push_back(field.key);
    }
    return v;
  }();
  return keys;
}

StatusOr<std::vector<int64_t>> ParseHiddenLayers(const std::string& text) {
  std::vector<int64_t> dims;
  const absl::string_view stripped = absl::StripAsciiWhitespace(text);
  // An empty value is most likely an unset shell variable: softmax
  // regression must be asked for by name.
  if (stripped.empty()) {
    return Usage("--hidden is empty: give the hidden layer sizes (e.g. 256 or 256,128), or 'none' for softmax "
                 "regression");
  }
  if (stripped == "none") return dims;
  for (absl::string_view part : absl::StrSplit(stripped, ',')) {
    int64_t d = 0;
    if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(part), &d) || d < 1 || d > (1 << 20)) {
      return Usage(absl::StrCat("--hidden: '", text,
                                "' is not a comma-separated list of layer sizes in [1, 1048576] (or 'none')"));
    }
    dims.push_back(d);
  }
  return dims;
}

StatusOr<std::string> ParseDeviceSetting(const std::string& text) {
  if (text == "auto") return std::string();
  if (text == "cpu") return std::string("/cpu:0");
  if (absl::StartsWith(text, "gpu:")) {
    const absl::string_view digits = absl::string_view(text).substr(4);
    int64_t n = 0;
    if (!digits.empty() && digits.size() <= 9 &&
        std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; }) &&
        absl::SimpleAtoi(digits, &n)) {
      return absl::StrCat("/gpu:", n);
    }
  }
  return Usage(absl::StrCat("--device: '", absl::CHexEscape(text),
                            "' is not a device (cpu, gpu:N with N the CUDA device's index, or auto)"));
}

double DefaultLearningRate(nn::OptimizerKind kind) {
  switch (kind) {
    case nn::OptimizerKind::kSgd: return 0.1;
    case nn::OptimizerKind::kMomentum: return 0.01;
    case nn::OptimizerKind::kAdam: return 0.001;
  }
  return 0.001;
}

Status ValidateMlpJobSettings(const MlpJobSettings& f) {
  if (f.batch_size < 1 || f.batch_size > (1 << 20)) {
    return Usage(absl::StrCat("--batch-size must be in [1, 1048576], got ", f.batch_size));
  }
  if (f.epochs < 0) return Usage(absl::StrCat("--epochs must be >= 0 (0: no limit), got ", f.epochs));
  if (f.max_steps < 0) return Usage(absl::StrCat("--max-steps must be >= 0 (0: no limit), got ", f.max_steps));
  if (f.epochs == 0 && f.max_steps == 0) {
    return Usage("--epochs 0 and --max-steps 0 would train forever: set one of them");
  }
  if (f.learning_rate && !(*f.learning_rate > 0 && std::isfinite(*f.learning_rate))) {
    return Usage(absl::StrCat("--learning-rate must be a positive number, got ", *f.learning_rate));
  }
  if (f.learning_rate_decay_steps < 0) {
    return Usage(absl::StrCat("--learning-rate-decay-steps must be >= 0 (0: a constant rate), got ",
                              f.learning_rate_decay_steps));
  }
  if (!(f.learning_rate_decay_rate > 0 && f.learning_rate_decay_rate <= 1)) {
    return Usage(absl::StrCat("--learning-rate-decay-rate must be in (0, 1], got ", f.learning_rate_decay_rate));
  }
  if (f.seed < 0) return Usage(absl::StrCat("--seed must be >= 0, got ", f.seed));
  if (f.threads < 0 || f.threads > 1024) {
    return Usage(absl::StrCat("--threads must be in [0, 1024] (0: one per CPU), got ", f.threads));
  }
  FOREMAN_RETURN_IF_ERROR(ParseDeviceSetting(f.device).status());
  if (f.device_memory_limit_mb < 0 || f.device_memory_limit_mb > (int64_t{1} << 30)) {
    return Usage(absl::StrCat("--device-memory-limit-mb must be in [0, 1073741824] (0: the device's own limit), got ",
                              f.device_memory_limit_mb));
  }
  if (f.eval_every_steps < 0) {
    return Usage(absl::StrCat("--eval-every-steps must be >= 0 (0: only at the end), got ", f.eval_every_steps));
  }
  if (f.log_step_count_steps < 0) {
    return Usage(absl::StrCat("--log-step-count-steps must be >= 0, got ", f.log_step_count_steps));
  }
  if (!(f.stop_grace_period_secs > 0 && std::isfinite(f.stop_grace_period_secs))) {
    return Usage(absl::StrCat("--stop-grace-period-secs must be a positive number, got ", f.stop_grace_period_secs));
  }
  if (f.prefetch_batches < 1 || f.prefetch_batches > 1024) {
    return Usage(absl::StrCat("--prefetch-batches must be in [1, 1024], got ", f.prefetch_batches));
  }
  // The job always checkpoints (a signal promises a final checkpoint) and
  // always writes summaries: TF's "0 disables" is refused here.
  FOREMAN_RETURN_IF_ERROR(CheckPositive("--save-checkpoint-secs", f.save_checkpoint_secs));
  FOREMAN_RETURN_IF_ERROR(CheckPositive("--save-checkpoint-steps", f.save_checkpoint_steps));
  FOREMAN_RETURN_IF_ERROR(CheckPositive("--save-summaries-secs", f.save_summaries_secs));
  FOREMAN_RETURN_IF_ERROR(CheckPositive("--save-summaries-steps", f.save_summaries_steps));
  FOREMAN_RETURN_IF_ERROR(ParseHiddenLayers(f.hidden).status());
  if (auto kind = nn::ParseOptimizerKind(f.optimizer); !kind.ok()) {
    return Usage(absl::StrCat("--optimizer: ", kind.status().message()));
  }
  if (!f.restart_policy.empty()) FOREMAN_RETURN_IF_ERROR(ParseRestartPolicy(f.restart_policy).status());
  return absl::OkStatus();
}

Status ResolveMlpJobSettings(const RunDirectory& run, const RunSettings& stored, const std::set<std::string>& given_flags,
                             MlpJobSettings& flags, std::vector<std::string>* notes) {
  const std::string& dir = run.path();
  const std::string path = run.settings_path();
  auto given = [&](const char* flag) { return flag != nullptr && given_flags.count(flag) > 0; };
  for (const Field& field : Fields()) {
    auto it = stored.find(field.key);
    if (it == stored.end()) continue;  // a file from an older version: the flag's value stands
    const std::string& stored_text = it->second;
    if (field.model) {
      auto stored_value = field.normalize(stored_text);
      if (!stored_value.ok()) {
        return absl::InvalidArgumentError(absl::StrCat(path, ": ", field.key, ": ", stored_value.status().message()));
      }
      if (given(field.flag)) {
        FOREMAN_ASSIGN_OR_RETURN(std::string value, field.normalize(field.get(flags)));
        if (value != *stored_value) {
          return absl::FailedPreconditionError(
              absl::StrCat(dir, " holds a run with ", field.flag, " ", *stored_value, " (", path, "), not ", value,
                           ": use another --checkpoint-dir, or the same ", field.flag, " to resume it"));
        }
      }
      field.set(*stored_value, flags);
      continue;
    }
    if (given(field.flag) || given(field.pair_flag)) {
      const std::string value = field.get(flags);
      if (given(field.flag) && value != stored_text && notes != nullptr) {
        notes->push_back(absl::StrCat(field.flag, " ", value, " replaces the stored ",
                                      stored_text.empty() ? "default" : stored_text));
      }
      continue;
    }
    if (!field.set(stored_text, flags)) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": ", field.key, " '", absl::CHexEscape(stored_text.substr(0, 80)), "' is not valid"));
    }
  }
  return absl::OkStatus();
}

RunSettings ToRunSettings(const MlpJobSettings& flags) {
  RunSettings settings;
  for (const Field& field : Fields()) {
    const std::string text = field.get(flags);
    auto normalized = field.normalize(text);
    settings[field.key] = normalized.ok() ? *normalized : text;
  }
  return settings;
}

}  // namespace foreman
