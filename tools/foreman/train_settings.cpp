// `foreman train`'s flags and settings file (train_settings.hpp).
#include "train_settings.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "command.hpp"

namespace foreman::cli {
namespace {

using Settings = std::map<std::string, std::string>;

std::string SettingsPath(const std::string& dir) { return dir + "/" + kTrainSettingsFile; }

// -- one stored field per flag ---------------------------------------------------

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
  std::function<std::string(const TrainFlags&)> get;
  std::function<bool(absl::string_view, TrainFlags&)> set;
  // The canonical text of a value, for comparing and storing.
  std::function<StatusOr<std::string>(const std::string&)> normalize;
};

template <class T>
Field MakeField(const char* key, const char* flag, T TrainFlags::*member) {
  Field f;
  f.key = key;
  f.flag = flag;
  f.get = [member](const TrainFlags& flags) { return ToText(flags.*member); };
  f.set = [member](absl::string_view s, TrainFlags& flags) { return FromText(s, &(flags.*member)); };
  f.normalize = [](const std::string& s) -> StatusOr<std::string> { return s; };
  return f;
}

const std::vector<Field>& Fields() {
  static const std::vector<Field> fields = [] {
    std::vector<Field> v;
    Field hidden = MakeField("hidden", "--hidden", &TrainFlags::hidden);
    hidden.model = true;
    hidden.normalize = [](const std::string& s) -> StatusOr<std::string> {
      FOREMAN_ASSIGN_OR_RETURN(std::vector<int64_t> dims, ParseHidden(s));
      return dims.empty() ? std::string("none") : absl::StrJoin(dims, ",");
    };
    v.push_back(hidden);
    Field optimizer = MakeField("optimizer", "--optimizer", &TrainFlags::optimizer);
    optimizer.model = true;
    optimizer.normalize = [](const std::string& s) -> StatusOr<std::string> {
      FOREMAN_ASSIGN_OR_RETURN(nn::OptimizerKind kind, nn::ParseOptimizerKind(s));
      return nn::OptimizerKindName(kind);
    };
    v.push_back(optimizer);
    Field seed = MakeField("seed", "--seed", &TrainFlags::seed);
    seed.model = true;
    seed.normalize = [](const std::string& s) -> StatusOr<std::string> {
      int64_t n = 0;
      if (!absl::SimpleAtoi(s, &n)) return absl::InvalidArgumentError(absl::StrCat("'", s, "' is not a number"));
      return std::to_string(n);
    };
    v.push_back(seed);
    v.push_back(MakeField("batch_size", "--batch-size", &TrainFlags::batch_size));
    v.push_back(MakeField("epochs", "--epochs", &TrainFlags::epochs));
    v.push_back(MakeField("max_steps", "--max-steps", &TrainFlags::max_steps));
    v.push_back(MakeField("threads", "--threads", &TrainFlags::threads));
    v.push_back(MakeField("device", "--device", &TrainFlags::device));
    v.push_back(
        MakeField("device_memory_limit_mb", "--device-memory-limit-mb", &TrainFlags::device_memory_limit_mb));
    v.push_back(MakeField("learning_rate", "--learning-rate", &TrainFlags::learning_rate));
    v.push_back(MakeField("learning_rate_decay_steps", "--learning-rate-decay-steps",
                          &TrainFlags::learning_rate_decay_steps));
    v.push_back(MakeField("learning_rate_decay_rate", "--learning-rate-decay-rate",
                          &TrainFlags::learning_rate_decay_rate));
    v.push_back(MakeField("data_dir", "--data-dir", &TrainFlags::data_dir));
    Field ckpt_secs = MakeField("save_checkpoint_secs", "--save-checkpoint-secs", &TrainFlags::save_checkpoint_secs);
    ckpt_secs.pair_flag = "--save-checkpoint-steps";
    v.push_back(ckpt_secs);
    Field ckpt_steps =
        MakeField("save_checkpoint_steps", "--save-checkpoint-steps", &TrainFlags::save_checkpoint_steps);
    ckpt_steps.pair_flag = "--save-checkpoint-secs";
    v.push_back(ckpt_steps);
    Field sum_steps = MakeField("save_summaries_steps", "--save-summaries-steps", &TrainFlags::save_summaries_steps);
    sum_steps.pair_flag = "--save-summaries-secs";
    v.push_back(sum_steps);
    Field sum_secs = MakeField("save_summaries_secs", "--save-summaries-secs", &TrainFlags::save_summaries_secs);
    sum_secs.pair_flag = "--save-summaries-steps";
    v.push_back(sum_secs);
    v.push_back(MakeField("log_step_count_steps", "--log-step-count-steps", &TrainFlags::log_step_count_steps));
    v.push_back(
        MakeField("stop_grace_period_secs", "--stop-grace-period-secs", &TrainFlags::stop_grace_period_secs));
    v.push_back(MakeField("eval_every_steps", "--eval-every-steps", &TrainFlags::eval_every_steps));
    v.push_back(MakeField("prefetch_batches", "--prefetch-batches", &TrainFlags::prefetch_batches));
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

StatusOr<std::vector<int64_t>> ParseHidden(const std::string& text) {
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

StatusOr<std::string> ParseDeviceFlag(const std::string& text) {
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

Status ValidateTrainFlags(const TrainFlags& f) {
  if (f.checkpoint_dir.empty()) return Usage("--checkpoint-dir must not be empty");
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
  FOREMAN_RETURN_IF_ERROR(ParseDeviceFlag(f.device).status());
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
  FOREMAN_RETURN_IF_ERROR(ParseHidden(f.hidden).status());
  if (auto kind = nn::ParseOptimizerKind(f.optimizer); !kind.ok()) {
    return Usage(absl::StrCat("--optimizer: ", kind.status().message()));
  }
  if (!f.restart_policy.empty()) FOREMAN_RETURN_IF_ERROR(ParseRestartPolicy(f.restart_policy).status());
  return absl::OkStatus();
}

StatusOr<std::optional<Settings>> ReadTrainSettings(Env* env, const std::string& dir) {
  const std::string path = SettingsPath(dir);
  // Only a missing file means a fresh run: any other error (EACCES, EIO)
  // is returned, never taken for "no settings" (which would refuse the
  // directory as another program's, or train again from step 0).
  if (Status exists = env->FileExists(path); absl::IsNotFound(exists)) {
    return std::optional<Settings>();
  } else if (!exists.ok()) {
    return exists;
  }
  FOREMAN_ASSIGN_OR_RETURN(std::string text, env->ReadFileToString(path));
  Settings settings;
  int line_number = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++line_number;
    line = absl::StripAsciiWhitespace(line);
    if (line.empty() || line[0] == '#') continue;
    std::vector<std::string> kv = absl::StrSplit(line, absl::MaxSplits('=', 1));
    if (kv.size() != 2) {
      return absl::InvalidArgumentError(absl::StrCat(path, ":", line_number, ": expected 'key = value', found '",
                                                     absl::CHexEscape(line.substr(0, 80)), "'"));
    }
    const std::string key(absl::StripAsciiWhitespace(kv[0]));
    if (settings.count(key) != 0) {
      return absl::InvalidArgumentError(absl::StrCat(path, ":", line_number, ": '", key, "' given twice"));
    }
    settings[key] = std::string(absl::StripAsciiWhitespace(kv[1]));
  }
  for (const Field& field : Fields()) {
    if (field.model && settings.count(field.key) == 0) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": missing '", field.key, "'"));
    }
  }
  return std::optional<Settings>(std::move(settings));
}

Status ResolveTrainFlags(const Settings& stored, const CLI::App& cmd, const std::string& dir, TrainFlags& flags,
                         std::vector<std::string>* notes) {
  const std::string path = SettingsPath(dir);
  auto given = [&](const char* flag) { return flag != nullptr && cmd.count(flag) > 0; };
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
      if (given(field.flag) && value != stored_text) {
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

Settings TrainSettings(const TrainFlags& flags) {
  Settings settings;
  for (const Field& field : Fields()) {
    const std::string text = field.get(flags);
    auto normalized = field.normalize(text);
    settings[field.key] = normalized.ok() ? *normalized : text;
  }
  return settings;
}

Status WriteTrainSettings(Env* env, const std::string& dir, const Settings& settings) {
  std::string text =
      "# foreman train: the settings of the run in this directory, read when it resumes: a flag not given\n"
      "# takes its value from here. hidden, optimizer and seed define the model and its data order.\n";
  for (const auto& [key, value] : settings) absl::StrAppend(&text, key, " = ", value, "\n");
  const std::string path = SettingsPath(dir);
  const std::string tmp = path + ".tmp";
  Status s = [&]() -> Status {
    FOREMAN_ASSIGN_OR_RETURN(auto file, env->NewWritableFile(tmp));
    FOREMAN_RETURN_IF_ERROR(file->Append(text));
    FOREMAN_RETURN_IF_ERROR(file->Sync());
    FOREMAN_RETURN_IF_ERROR(file->Close());
    FOREMAN_RETURN_IF_ERROR(env->RenameFile(tmp, path));
    return env->SyncDir(dir);
  }();
  if (!s.ok() && env->FileExists(tmp).ok()) env->DeleteFile(tmp).IgnoreError();
  return s;
}

void AddTrainFlags(CLI::App& cmd, TrainFlags& f) {
  // MonitoredTrainingSession's arguments (TF's names and defaults).
  cmd.add_option("--checkpoint-dir", f.checkpoint_dir, "Checkpoints, events, the run's settings and log")
      ->capture_default_str();
  cmd.add_option("--save-checkpoint-secs", f.save_checkpoint_secs,
                 "Save every N seconds (TF's default 600 when neither this nor --save-checkpoint-steps is set)");
  cmd.add_option("--save-checkpoint-steps", f.save_checkpoint_steps, "Save every N global steps")
      ->transform(DecimalInt64());
  cmd.add_option("--save-summaries-steps", f.save_summaries_steps,
                 "Write summaries every N global steps (TF's default 100)")
      ->transform(DecimalInt64());
  cmd.add_option("--save-summaries-secs", f.save_summaries_secs, "Write summaries every N seconds");
  cmd.add_option("--log-step-count-steps", f.log_step_count_steps,
                 "global_step/sec every N steps; also the interval of plain progress lines (0: no step counter)")
      ->transform(DecimalInt64())
      ->capture_default_str();
  cmd.add_option("--stop-grace-period-secs", f.stop_grace_period_secs,
                 "After a signal, how long the final checkpoint may take")
      ->capture_default_str();
  // The job's own.
  cmd.add_option("--max-steps", f.max_steps, "Stop at this global_step (0: no limit)")
      ->transform(DecimalInt64())
      ->capture_default_str();
  cmd.add_option("--epochs", f.epochs, "Passes over the training data (0: no limit)")
      ->transform(DecimalInt64())
      ->capture_default_str();
  cmd.add_option("--batch-size", f.batch_size, "Examples per step")->transform(DecimalInt64())->capture_default_str();
  cmd.add_option("--learning-rate", f.learning_rate, "Default: 0.001 for adam, 0.01 for momentum (0.9), 0.1 for sgd");
  cmd.add_option("--learning-rate-decay-steps", f.learning_rate_decay_steps,
                 "TF's exponential_decay: the rate is multiplied by --learning-rate-decay-rate every this many "
                 "steps, continuously (0: a constant rate)")
      ->transform(DecimalInt64())
      ->capture_default_str();
  cmd.add_option("--learning-rate-decay-rate", f.learning_rate_decay_rate, "In (0, 1]")->capture_default_str();
  cmd.add_option("--optimizer", f.optimizer, "sgd | momentum | adam")->capture_default_str();
  cmd.add_option("--hidden", f.hidden, "Hidden layer sizes, comma-separated ('none': softmax regression)")
      ->capture_default_str();
  cmd.add_option("--seed", f.seed, "Initial weights and data order")
      ->transform(DecimalInt64())
      ->capture_default_str();
  cmd.add_option("--threads", f.threads, "Intra-op threads (0: one per CPU this process may use)")
      ->transform(DecimalInt64())->capture_default_str();
  cmd.add_option("--device", f.device,
                 "Where the step runs: cpu, gpu:N (CUDA device N; exit 2 when it cannot be used) or auto (GPU 0 "
                 "when a session can be made there, else the CPU; said on stderr). Not model-defining: a run may "
                 "resume on another device")
      ->capture_default_str();
  cmd.add_option("--device-memory-limit-mb", f.device_memory_limit_mb,
                 "At most this many MiB of GPU memory (0: the device's own limit); running out is exit 2 naming "
                 "the device and the size. Ignored on the CPU")
      ->transform(DecimalInt64())
      ->capture_default_str();
  cmd.add_option("--data-dir", f.data_dir, "Fashion-MNIST's gzip IDX files (Debian: dataset-fashion-mnist)")
      ->capture_default_str();
  cmd.add_option("--eval-every-steps", f.eval_every_steps,
                 "Test-set accuracy every N global steps into <checkpoint-dir>/eval (0: only at the end)")
      ->transform(DecimalInt64())->capture_default_str();
  cmd.add_option("--prefetch-batches", f.prefetch_batches, "Batches the input pipeline prepares ahead")
      ->transform(DecimalInt64())->capture_default_str();
  cmd.add_option("--fault-plan", f.fault_plan,
                 "Inject the faults of this JSON plan (docs/fault-injection.md): env faults into the job's file "
                 "system, step, hook and process (SIGKILL/SIGTERM) faults into training; those that fire are "
                 "recorded in <checkpoint-dir>/fault_record.json and, unless marked repeat, do not fire again "
                 "when the run is restarted. Not stored in the run's settings")
      ->check(NonEmpty());
  cmd.add_option("--restart-policy", f.restart_policy,
                 "Restart failing service actors (summary writer, checkpoint saver, step counter, input pipeline) "
                 "instead of "
                 "ending the run, in Erlang/OTP's terms, e.g. \"one_for_one,max_restarts=3,period_secs=60,"
                 "summary_writer=permanent,checkpoint_saver=permanent\" (docs/train.md). Default: TF's (a "
                 "failing service ends the run). Not stored in the run's settings")
      ->check(NonEmpty());
  // A cluster (cluster_task.hpp): all of the first four or none; never stored.
  const char* kCluster = "Cluster (TF1 between-graph replication; not stored in the run's settings)";
  cmd.add_option("--ps-hosts", f.cluster.ps_hosts, "The ps tasks: host:port[,host:port...]")->group(kCluster);
  cmd.add_option("--worker-hosts", f.cluster.worker_hosts,
                 "The worker tasks: host:port[,host:port...]; worker 0 is the chief")
      ->group(kCluster);
  cmd.add_option("--job-name", f.cluster.job_name,
                 "This process's job: ps (serves its share of the variables, needs the optimizer flags but no "
                 "data or checkpoint directory) or worker (trains; worker k shuffles the data with --seed + k, so "
                 "each worker reads its own order and worker 0's is --seed's)")
      ->group(kCluster);
  cmd.add_option("--task-index", f.cluster.task_index, "This process's task in its job (0-based)")
      ->transform(DecimalInt64())
      ->group(kCluster);
  cmd.add_option("--heartbeat-ms", f.cluster.heartbeat_ms,
                 "Heartbeat interval between the tasks (give every task the same); also a worker's poll interval "
                 "while it waits for the chief")
      ->transform(DecimalInt64())
      ->capture_default_str()
      ->group(kCluster);
  cmd.add_option("--connection-timeout-ms", f.cluster.connection_timeout_ms,
                 "A peer not heard from for this long is down (at least 3 x --heartbeat-ms)")
      ->transform(DecimalInt64())
      ->capture_default_str()
      ->group(kCluster);
  cmd.add_option("--ps-wait-secs", f.cluster.ps_wait_secs,
                 "How long a recovery waits for a ps task that is down; also how long a worker waits for the "
                 "chief to prepare the session")
      ->transform(DecimalInt64())
      ->capture_default_str()
      ->group(kCluster);
  cmd.add_option("--ps-join-timeout-secs", f.cluster.ps_join_timeout_secs,
                 "A ps task's bound on its wait for the chief to end training; past it the ps exits 1")
      ->transform(DecimalInt64())
      ->capture_default_str()
      ->group(kCluster);
  cmd.add_option("--replicas-to-aggregate", f.cluster.replicas_to_aggregate,
                 "Synchronous training (TF's SyncReplicasOptimizer): each update averages the gradients of this "
                 "many workers computed at one global_step; stale ones are dropped (>= 1; left out: asynchronous "
                 "training, TF1's default)")
      ->transform(DecimalInt64())
      ->group(kCluster);
  cmd.add_option("--total-num-replicas", f.cluster.total_num_replicas,
                 "Synchronous training: how many workers send gradients (>= --replicas-to-aggregate; more are "
                 "backup workers whose late gradients are dropped; left out: the number of workers)")
      ->transform(DecimalInt64())
      ->group(kCluster);
  cmd.add_option("--operation-timeout-ms", f.cluster.operation_timeout_ms,
                 "A worker's bound on one read or update of a ps task (TF's operation_timeout_in_ms); in "
                 "synchronous training also how long an update waits for the other workers' gradients")
      ->transform(DecimalInt64())
      ->capture_default_str()
      ->group(kCluster);
  cmd.add_option("--tls-cert", f.cluster.tls_cert, "Mutual TLS: this task's PEM certificate (with --tls-key, --tls-ca)")
      ->check(NonEmpty())
      ->group(kCluster);
  cmd.add_option("--tls-key", f.cluster.tls_key, "Mutual TLS: the certificate's unencrypted PEM key")
      ->check(NonEmpty())
      ->group(kCluster);
  cmd.add_option("--tls-ca", f.cluster.tls_ca, "Mutual TLS: the PEM CA certificates peers must chain to")
      ->check(NonEmpty())
      ->group(kCluster);
  cmd.add_flag("--insecure", f.cluster.insecure,
               "Allow non-loopback addresses without TLS (plain connections have no authentication)")
      ->group(kCluster);
  // A flag given twice takes its last value (a script's defaults, then the user's).
  for (CLI::Option* option : cmd.get_options()) option->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
}

}  // namespace foreman::cli
