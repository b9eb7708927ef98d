// The MLP training job's settings (foreman/mlp_job.hpp; TF Estimator's
// RunConfig and a canned estimator's parameters in one struct), their checks,
// their text form in the run directory's settings file, and how a resumed run
// resolves them against the stored ones.
//
// Each setting is `foreman train`'s flag of the same name (batch_size is
// --batch-size, docs say what each does) and every message names the setting
// as that flag. The stored form is one `key = value` line per setting in
// <checkpoint_dir>/train_settings.txt (RunDirectory::WriteSettings):
//
//   ```cpp
//   #include "foreman/mlp_job_settings.hpp"
//   #include "foreman/run_directory.hpp"
//   foreman::MlpJobSettings settings;  // foreman train's defaults
//   settings.checkpoint_dir = "mlp_run";
//   settings.hidden = "32";
//   settings.max_steps = 100;
//   FOREMAN_RETURN_IF_ERROR(foreman::ValidateMlpJobSettings(settings));
//   FOREMAN_ASSIGN_OR_RETURN(auto dir, foreman::OpenRunDirectory(settings.checkpoint_dir));
//   FOREMAN_ASSIGN_OR_RETURN(auto stored, dir->ReadSettings(foreman::MlpJobModelKeys()));
//   std::vector<std::string> notes;
//   if (stored) {  // a resume: settings not given take the stored values
//     FOREMAN_RETURN_IF_ERROR(foreman::ResolveMlpJobSettings(*dir, *stored, {"--max-steps"}, settings, &notes));
//   }
//   if (!dir->Commit()) return absl::CancelledError("undone");
//   FOREMAN_RETURN_IF_ERROR(dir->WriteSettings(foreman::ToRunSettings(settings), foreman::kMlpJobSettingsComment));
//   ```
#pragma once

#include <cstdint>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "foreman/dataset.hpp"
#include "foreman/nn.hpp"
#include "foreman/run_directory.hpp"
#include "foreman/status.hpp"

namespace foreman {

/// The MLP job's settings. Plain data; copyable. Defaults are foreman
/// train's. Times in seconds; an unset optional means TF's default.
struct MlpJobSettings {
  /// The run directory (checkpoints, events, eval/); empty: a job that
  /// writes nothing (no checkpoints, summaries or evaluation).
  std::string checkpoint_dir = "foreman-train";
  /// Fashion-MNIST's gzip IDX files (data::LoadFashionMnist).
  std::string data_dir = data::kFashionMnistDir;
  // MonitoredTrainingSession's schedules (at most one of each pair).
  std::optional<double> save_checkpoint_secs;
  std::optional<int64_t> save_checkpoint_steps;
  std::optional<int64_t> save_summaries_steps;
  std::optional<double> save_summaries_secs;
  /// global_step/sec every N steps (0: no step counter); also the interval
  /// of plain progress lines.
  int64_t log_step_count_steps = 100;
  double stop_grace_period_secs = 120;
  /// Stop at this global_step (0: no limit; StopAtStepHook's last_step).
  int64_t max_steps = 0;
  /// Passes over the training data (0: no limit); the end of the last is
  /// OUT_OF_RANGE, a clean stop.
  int64_t epochs = 15;
  int64_t batch_size = 128;
  /// The initial learning rate; unset: DefaultLearningRate(optimizer).
  std::optional<double> learning_rate;
  /// TF's exponential_decay (staircase=False): the rate at global_step s is
  /// learning_rate * learning_rate_decay_rate ^ (s / learning_rate_decay_steps);
  /// 0 steps: a constant rate.
  int64_t learning_rate_decay_steps = 1000;
  double learning_rate_decay_rate = 0.8;
  /// "sgd", "momentum" (0.9) or "adam" (TF1's formulas and defaults).
  std::string optimizer = "adam";
  /// Hidden layer sizes, comma-separated ("256,128"); "none": softmax
  /// regression (ParseHiddenLayers).
  std::string hidden = "256";
  /// The initial weights (glorot uniform) and the data order.
  int64_t seed = 0;
  /// Intra-op threads; 0: one per CPU this process may run on (PlanMlpJob
  /// resolves it).
  int64_t threads = 0;
  /// "cpu", "gpu:N" or "auto" (ParseDeviceSetting, ResolveMlpJobDevice).
  std::string device = "auto";
  /// SessionConfig.device_memory_limit_bytes in MiB (0: the device's own).
  int64_t device_memory_limit_mb = 0;
  /// Test-set evaluation at every multiple of N global steps and at the
  /// final one (0: only at the final one).
  int64_t eval_every_steps = 500;
  /// Batches the input pipeline prepares ahead.
  int64_t prefetch_batches = 4;
  /// The session's RestartPolicy in ParseRestartPolicy's syntax; empty:
  /// TF's (a failing service ends the run). Never stored: how to survive a
  /// failing service is not what is trained.
  std::string restart_policy;
};

/// Checks the settings on their own (checkpoint_dir may be empty).
/// INVALID_ARGUMENT naming the setting as its flag and the value, e.g.
/// "--batch-size must be in [1, 1048576], got 0"; "--epochs 0 and
/// --max-steps 0 would train forever: set one of them"; the schedules must
/// be > 0 when set (the job always checkpoints and writes summaries: TF's
/// "0 disables" is refused); ParseHiddenLayers', ParseDeviceSetting's and
/// ParseRestartPolicy's refusals. Thread-safe.
Status ValidateMlpJobSettings(const MlpJobSettings& settings);

/// MlpJobSettings::hidden: "256,128" -> {256, 128}; "none" -> {} (softmax
/// regression); sizes in [1, 1048576]. INVALID_ARGUMENT naming the text,
/// and for an empty (or blank) text: softmax regression is asked for by
/// name, an empty value is more likely an unset variable. Thread-safe.
StatusOr<std::vector<int64_t>> ParseHiddenLayers(const std::string& text);

/// MlpJobSettings::device: "cpu" -> "/cpu:0", "gpu:N" -> "/gpu:N" (N decimal
/// digits, < 10^9), "auto" -> "" (ResolveMlpJobDevice decides). The result
/// is a SessionConfig.device. INVALID_ARGUMENT naming the text otherwise.
/// Thread-safe.
StatusOr<std::string> ParseDeviceSetting(const std::string& text);

/// The initial learning rate when MlpJobSettings::learning_rate is unset:
/// 0.1 for sgd, 0.01 for momentum, 0.001 for adam.
double DefaultLearningRate(nn::OptimizerKind kind);

// -- the settings file ------------------------------------------------------------------

/// The keys of the settings that define the model and its data order:
/// "hidden", "optimizer", "seed". A stored settings file must hold them
/// (RunDirectory::ReadSettings' required_keys) and a resume may not change
/// them.
const std::vector<std::string>& MlpJobModelKeys();

/// The comment that opens the job's settings file (RunDirectory::WriteSettings).
extern const char kMlpJobSettingsComment[];

/// The settings to store, key -> canonical text (keys as the flags with '_'
/// for '-': batch_size, save_checkpoint_secs, ...; an unset optional is an
/// empty value; hidden, optimizer and seed normalized). checkpoint_dir and
/// restart_policy are not stored. Store them after PlanMlpJob resolved
/// `threads`.
RunSettings ToRunSettings(const MlpJobSettings& settings);

/// Resolves `settings` against the ones `dir` stores (`stored`, from
/// dir.ReadSettings(MlpJobModelKeys())) for a resumed run: a setting whose
/// flag is not in `given` ("--batch-size", ...: what the user gave
/// explicitly) takes the stored value; the schedules go in pairs (giving
/// either of --save-checkpoint-secs / --save-checkpoint-steps drops both
/// stored ones, the same for the summary pair). A key the file lacks keeps
/// the value in `settings` (a file from an older version).
///   FAILED_PRECONDITION  a given hidden, optimizer or seed that differs from
///                        the stored one: "<dir> holds a run with --hidden 32
///                        (<file>), not 64: use another --checkpoint-dir, or
///                        the same --hidden to resume it"
///   INVALID_ARGUMENT     a stored value that does not parse, naming the
///                        file and key
/// `notes` gets one line per given flag whose value replaces a different
/// stored one ("--max-steps 200 replaces the stored 100"). Validate the
/// result again: stored values may be out of range.
Status ResolveMlpJobSettings(const RunDirectory& dir, const RunSettings& stored, const std::set<std::string>& given,
                             MlpJobSettings& settings, std::vector<std::string>* notes);

}  // namespace foreman
