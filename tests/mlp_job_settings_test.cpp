// The MLP job's settings (include/foreman/mlp_job_settings.hpp): the checks
// and their messages, the layer and device texts, the stored form, and a
// resume's resolution against a run directory's stored settings.
#include <doctest/doctest.h>

#include <cmath>
#include <functional>
#include <limits>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "foreman/mlp_job.hpp"
#include "foreman/mlp_job_settings.hpp"
#include "foreman/run_directory.hpp"
#include "support/test_util.hpp"

namespace foreman {
namespace {

using testing::TempDir;

TEST_CASE("ValidateMlpJobSettings: foreman train's defaults are valid; each bad setting is named as its flag") {
  CHECK(ValidateMlpJobSettings(MlpJobSettings()).ok());
  MlpJobSettings no_dir;
  no_dir.checkpoint_dir.clear();  // a job that writes nothing
  CHECK(ValidateMlpJobSettings(no_dir).ok());
  struct Case {
    std::function<void(MlpJobSettings&)> edit;
    std::string message;
  };
  const std::vector<Case> cases = {
      {[](MlpJobSettings& s) { s.batch_size = 0; }, "--batch-size must be in [1, 1048576], got 0"},
      {[](MlpJobSettings& s) { s.epochs = -1; }, "--epochs must be >= 0 (0: no limit), got -1"},
      {[](MlpJobSettings& s) { s.max_steps = -2; }, "--max-steps must be >= 0 (0: no limit), got -2"},
      {[](MlpJobSettings& s) { s.epochs = 0; }, "--epochs 0 and --max-steps 0 would train forever: set one of them"},
      {[](MlpJobSettings& s) { s.learning_rate = -1; }, "--learning-rate must be a positive number, got -1"},
      {[](MlpJobSettings& s) { s.learning_rate_decay_steps = -1; },
       "--learning-rate-decay-steps must be >= 0 (0: a constant rate), got -1"},
      {[](MlpJobSettings& s) { s.learning_rate_decay_rate = 1.5; },
       "--learning-rate-decay-rate must be in (0, 1], got 1.5"},
      {[](MlpJobSettings& s) { s.seed = -1; }, "--seed must be >= 0, got -1"},
      {[](MlpJobSettings& s) { s.threads = 1025; }, "--threads must be in [0, 1024] (0: one per CPU), got 1025"},
      {[](MlpJobSettings& s) { s.device = "tpu"; }, "--device: 'tpu' is not a device (cpu, gpu:N"},
      {[](MlpJobSettings& s) { s.device_memory_limit_mb = -1; }, "--device-memory-limit-mb must be in [0, 1073741824]"},
      {[](MlpJobSettings& s) { s.eval_every_steps = -1; }, "--eval-every-steps must be >= 0 (0: only at the end), got -1"},
      {[](MlpJobSettings& s) { s.log_step_count_steps = -1; }, "--log-step-count-steps must be >= 0, got -1"},
      {[](MlpJobSettings& s) { s.stop_grace_period_secs = std::numeric_limits<double>::infinity(); },
       "--stop-grace-period-secs must be a positive number, got inf"},
      {[](MlpJobSettings& s) { s.prefetch_batches = 0; }, "--prefetch-batches must be in [1, 1024], got 0"},
      {[](MlpJobSettings& s) { s.save_checkpoint_secs = 0; }, "--save-checkpoint-secs must be a positive number of seconds, got 0"},
      {[](MlpJobSettings& s) { s.save_checkpoint_steps = -5; }, "--save-checkpoint-steps must be >= 1, got -5"},
      {[](MlpJobSettings& s) { s.save_summaries_secs = -1; }, "--save-summaries-secs must be a positive number of seconds"},
      {[](MlpJobSettings& s) { s.save_summaries_steps = 0; }, "--save-summaries-steps must be >= 1, got 0"},
      {[](MlpJobSettings& s) { s.hidden = "12,x"; }, "--hidden: '12,x' is not a comma-separated list of layer sizes"},
      {[](MlpJobSettings& s) { s.optimizer = "rmsprop"; }, "--optimizer: unknown optimizer 'rmsprop'"},
      {[](MlpJobSettings& s) { s.restart_policy = "bogus"; }, "--restart-policy \"bogus\": part 1 \"bogus\""},
  };
  for (const Case& c : cases) {
    MlpJobSettings s;
    c.edit(s);
    Status status = ValidateMlpJobSettings(s);
    CHECK(absl::IsInvalidArgument(status));
    CHECK_MESSAGE(absl::StartsWith(status.message(), c.message), status.message());
  }
}

TEST_CASE("ParseHiddenLayers, ParseDeviceSetting and DefaultLearningRate") {
  CHECK(ParseHiddenLayers("256").value() == std::vector<int64_t>{256});
  CHECK(ParseHiddenLayers(" 64, 32 ").value() == std::vector<int64_t>{64, 32});
  CHECK(ParseHiddenLayers("none").value().empty());
  CHECK(ParseHiddenLayers("1048576").ok());
  for (const std::string bad : {"0", "1048577", "4,", "-3", "x"}) {
    auto parsed = ParseHiddenLayers(bad);
    CHECK_MESSAGE(absl::IsInvalidArgument(parsed.status()), bad);
  }
  auto empty = ParseHiddenLayers("  ");
  CHECK(empty.status().message() ==
        "--hidden is empty: give the hidden layer sizes (e.g. 256 or 256,128), or 'none' for softmax regression");

  CHECK(ParseDeviceSetting("cpu").value() == "/cpu:0");
  CHECK(ParseDeviceSetting("gpu:0").value() == "/gpu:0");
  CHECK(ParseDeviceSetting("gpu:007").value() == "/gpu:7");
  CHECK(ParseDeviceSetting("auto").value().empty());
  for (const std::string bad : {"gpu:", "gpu:-1", "gpu:1234567890", "GPU:0", "/gpu:0", "cpu:0", ""}) {
    CHECK_MESSAGE(absl::IsInvalidArgument(ParseDeviceSetting(bad).status()), bad);
  }
  CHECK(DefaultLearningRate(nn::OptimizerKind::kSgd) == 0.1);
  CHECK(DefaultLearningRate(nn::OptimizerKind::kMomentum) == 0.01);
  CHECK(DefaultLearningRate(nn::OptimizerKind::kAdam) == 0.001);
}

TEST_CASE("ToRunSettings stores every setting but the directory and the restart policy, normalized") {
  MlpJobSettings s;
  s.hidden = " 64 , 32";
  s.optimizer = "sgd";
  s.seed = 7;
  s.save_checkpoint_steps = 50;
  s.learning_rate = 0.25;
  s.restart_policy = "one_for_one";
  const RunSettings stored = ToRunSettings(s);
  CHECK(stored.at("hidden") == "64,32");
  CHECK(stored.at("optimizer") == "sgd");
  CHECK(stored.at("seed") == "7");
  CHECK(stored.at("save_checkpoint_steps") == "50");
  CHECK(stored.at("save_checkpoint_secs").empty());  // unset: TF's default
  CHECK(stored.at("learning_rate") == "0.25");
  CHECK(stored.at("learning_rate_decay_rate") == "0.80000000000000004");  // %.17g: read back exactly
  CHECK(stored.at("data_dir") == data::kFashionMnistDir);
  CHECK(stored.count("checkpoint_dir") == 0);
  CHECK(stored.count("restart_policy") == 0);
  CHECK(stored.size() == 21);
  CHECK(MlpJobModelKeys() == std::vector<std::string>{"hidden", "optimizer", "seed"});
  CHECK(absl::StartsWith(kMlpJobSettingsComment, "# foreman train: the settings of the run in this directory"));
}

TEST_CASE("ResolveMlpJobSettings: settings not given take the stored values; schedules go in pairs; the model's "
          "may not change") {
  TempDir tmp;
  const std::string dir = tmp / "run";
  auto run = OpenRunDirectory(dir);
  REQUIRE(run.ok());
  MlpJobSettings first;
  first.hidden = "32";
  first.seed = 3;
  first.max_steps = 100;
  first.save_checkpoint_steps = 20;
  first.threads = 2;
  REQUIRE((*run)->WriteSettings(ToRunSettings(first), kMlpJobSettingsComment).ok());
  auto stored = (*run)->ReadSettings(MlpJobModelKeys());
  REQUIRE(stored.ok());
  REQUIRE(stored->has_value());

  // Nothing given: the stored run, exactly.
  MlpJobSettings resumed;
  std::vector<std::string> notes;
  REQUIRE(ResolveMlpJobSettings(**run, **stored, {}, resumed, &notes).ok());
  CHECK(ToRunSettings(resumed) == ToRunSettings(first));
  CHECK(notes.empty());

  // Given flags stand, with a note when they replace a stored value; one of
  // a pair drops the other's stored value.
  MlpJobSettings given;
  given.max_steps = 200;
  given.save_checkpoint_secs = 30;
  given.hidden = "32";
  notes.clear();
  REQUIRE(ResolveMlpJobSettings(**run, **stored, {"--max-steps", "--save-checkpoint-secs", "--hidden"}, given, &notes)
              .ok());
  CHECK(given.max_steps == 200);
  CHECK(given.save_checkpoint_secs == 30.0);
  CHECK_FALSE(given.save_checkpoint_steps.has_value());
  CHECK(given.seed == 3);
  CHECK(given.threads == 2);
  CHECK(notes == std::vector<std::string>{"--max-steps 200 replaces the stored 100",
                                          "--save-checkpoint-secs 30 replaces the stored default"});

  // The model's settings: a different given value is refused, naming both.
  MlpJobSettings other;
  other.hidden = "64";
  Status refused = ResolveMlpJobSettings(**run, **stored, {"--hidden"}, other, &notes);
  CHECK(absl::IsFailedPrecondition(refused));
  CHECK(refused.message() == absl::StrCat(dir, " holds a run with --hidden 32 (", dir,
                                          "/train_settings.txt), not 64: use another --checkpoint-dir, or the same "
                                          "--hidden to resume it"));

  // A stored value that does not parse names the file and key.
  RunSettings bad = **stored;
  bad["batch_size"] = "many";
  MlpJobSettings s;
  Status invalid = ResolveMlpJobSettings(**run, bad, {}, s, nullptr);
  CHECK(absl::IsInvalidArgument(invalid));
  CHECK(invalid.message() == absl::StrCat(dir, "/train_settings.txt: batch_size 'many' is not valid"));
  bad = **stored;
  bad["hidden"] = "x";
  CHECK(ResolveMlpJobSettings(**run, bad, {}, s, nullptr).message() ==
        absl::StrCat(dir, "/train_settings.txt: hidden: --hidden: 'x' is not a comma-separated list of layer sizes in "
                          "[1, 1048576] (or 'none')"));
  // A key the file lacks (an older version's) keeps the value given.
  bad = **stored;
  bad.erase("prefetch_batches");
  MlpJobSettings older;
  older.prefetch_batches = 9;
  REQUIRE(ResolveMlpJobSettings(**run, bad, {}, older, nullptr).ok());
  CHECK(older.prefetch_batches == 9);
}

TEST_CASE("PlanMlpJob resolves the threads and refuses a model above 16 GiB and schedules the session refuses") {
  MlpJobSettings s;
  s.threads = 0;
  s.hidden = "8";
  s.optimizer = "momentum";
  auto plan = PlanMlpJob(s);
  REQUIRE_MESSAGE(plan.ok(), plan.status().ToString());
  CHECK(s.threads >= 1);
  CHECK(plan->spec.hidden == std::vector<int64_t>{8});
  CHECK(plan->spec.input_dim == 784);
  CHECK(plan->optimizer.kind == nn::OptimizerKind::kMomentum);
  CHECK(plan->learning_rate == 0.01);
  CHECK(plan->optimizer.learning_rate == 0.01f);

  s.hidden = "1048576,1048576";
  auto huge = PlanMlpJob(s);
  CHECK(absl::IsInvalidArgument(huge.status()));
  CHECK_MESSAGE(absl::StartsWith(huge.status().message(), "--hidden 1048576,1048576: the model and its optimizer "
                                                          "slots would take "),
                huge.status().message());
  CHECK(absl::EndsWith(huge.status().message(), " GiB (at most 16 GiB)"));

  s.hidden = "8";
  s.save_checkpoint_secs = 10;
  s.save_checkpoint_steps = 10;
  auto both = PlanMlpJob(s);
  CHECK(absl::IsInvalidArgument(both.status()));
}

}  // namespace
}  // namespace foreman
