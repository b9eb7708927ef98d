// The Saver's commit protocol under crashes (include/foreman/checkpoint.hpp):
// a power cut after any number of file-system operations of Save() leaves
// the previous checkpoint listed and intact, and the new one complete or
// absent. MemEnv's crash model drops whatever was not synced. A process kill
// (every completed operation survives) is modelled by stopping the file
// system after k operations and re-activating it without Crash().
#include <doctest/doctest.h>

#include <string>

#include "absl/strings/str_cat.h"
#include "foreman/bundle.hpp"
#include "foreman/checkpoint.hpp"
#include "foreman/mem_env.hpp"
#include "platform/log.hpp"
#include "support/checkpoint_checks.hpp"

namespace foreman {
namespace {

constexpr char kStep1[] = "/ckpt/model.ckpt-1";
constexpr char kStep2[] = "/ckpt/model.ckpt-2";

/// The variables as saved at `step`: w = [step, step + 0.5], a string, global_step.
void Fill(VariableStore* vars, int64_t step) {
  const float s = static_cast<float>(step);
  REQUIRE(vars->Assign("w", *Tensor::FromVector<float>({s, s + 0.5f}, {2})).ok());
  REQUIRE(vars->Assign("vocab", *Tensor::FromVector<std::string>({"step", std::to_string(step)}, {2})).ok());
  REQUIRE(SetGlobalStep(*vars, step).ok());
}

void CreateVars(VariableStore* vars) {
  REQUIRE(vars->Create("w", Tensor(DataType::kFloat, {2})).ok());
  REQUIRE(vars->Create("vocab", Tensor(DataType::kString, {2})).ok());
  REQUIRE(CreateGlobalStep(*vars).ok());
}

/// `prefix` verifies, restores, and holds step `step`'s values.
void CheckRestores(Env* env, const std::string& prefix, int64_t step) {
  testing::CheckRestores(env, prefix, step, CreateVars, Fill);
}

/// Crashes Save(step 2) after k = 0, 1, 2, ... operations until one completes
/// without crashing, then crashes after it; returns how many crash points
/// were tested.
int RunCrashSweep(int max_to_keep) {
  for (int64_t k = 0; k < 10000; ++k) {
    CAPTURE(k);
    MemEnv env;
    ManualClock clock;
    REQUIRE(env.RecursivelyCreateDir("/ckpt").ok());
    SaverOptions o;
    o.env = &env;
    o.clock = &clock;
    o.max_to_keep = max_to_keep;
    auto saver = Saver::Create(o);
    REQUIRE(saver.ok());
    VariableStore vars;
    CreateVars(&vars);
    Fill(&vars, 1);
    REQUIRE((*saver)->Save(vars, "/ckpt/model.ckpt", 1).ok());

    Fill(&vars, 2);
    env.SetCrashAfterOperations(k);
    const bool saved = (*saver)->Save(vars, "/ckpt/model.ckpt", 2).ok();
    // Save() ignores failed deletions: it completed only if the crash never came.
    const bool completed = saved && env.FileExists("/ckpt").ok();
    env.Crash();

    auto latest = LatestCheckpoint(&env, "/ckpt");
    REQUIRE_MESSAGE(latest.ok(), latest.status().ToString());
    REQUIRE(latest->has_value());
    const std::string& prefix = **latest;
    REQUIRE((prefix == kStep1 || prefix == kStep2));
    CheckRestores(&env, prefix, prefix == kStep1 ? 1 : 2);

    auto state = ReadCheckpointState(&env, "/ckpt");
    REQUIRE_MESSAGE(state.ok(), state.status().ToString());   // never torn
    REQUIRE(state->has_value());
    for (const std::string& listed : (*state)->all_model_checkpoint_paths) {
      const std::string path = ResolveCheckpointPath("/ckpt", listed);
      if (path == kStep1) CheckRestores(&env, kStep1, 1);   // listed => intact
    }
    if (completed) {
      CHECK(prefix == kStep2);
      CHECK((*state)->model_checkpoint_path == "model.ckpt-2");
      return static_cast<int>(k) + 1;
    }
  }
  FAIL("Save never completed");
  return 0;
}

enum class CrashKind { kPowerCut, kProcessKill };

/// After a restart at step 200, TF re-saves model.ckpt-200 with the restored
/// (identical) values. Sweeps a crash of kind `kind` over that re-save and
/// checks the checkpoint always verifies and restores. With `foreign_layout`
/// the existing bundle was laid out by another writer (as TF does): data in
/// another order than the Saver writes, so a rewrite would change the data
/// file. Returns how many crash points were tested.
int RunResaveSweep(CrashKind kind, bool foreign_layout) {
  constexpr char kStep200[] = "/ckpt/model.ckpt-200";
  for (int64_t k = 0; k < 10000; ++k) {
    CAPTURE(k);
    MemEnv env;
    ManualClock clock;
    REQUIRE(env.RecursivelyCreateDir("/ckpt").ok());
    SaverOptions o;
    o.env = &env;
    o.clock = &clock;
    VariableStore vars;
    CreateVars(&vars);
    Fill(&vars, 200);
    if (foreign_layout) {
      auto w = BundleWriter::Create(&env, kStep200);
      REQUIRE(w.ok());
      for (const char* name : {"w", "vocab", "global_step"}) REQUIRE((*w)->Add(name, **vars.Get(name)).ok());
      REQUIRE((*w)->Finish().ok());
      CheckpointState state;
      state.model_checkpoint_path = kStep200;
      REQUIRE(WriteCheckpointState(&env, "/ckpt", state).ok());
    } else {
      auto first = Saver::Create(o);
      REQUIRE(first.ok());
      REQUIRE((*first)->Save(vars, "/ckpt/model.ckpt", 200).ok());
    }

    // The restarted process: a new Saver, the restored values, the same step.
    auto saver = Saver::Create(o);
    REQUIRE(saver.ok());
    env.SetCrashAfterOperations(k);
    const bool saved = (*saver)->Save(vars, "/ckpt/model.ckpt", 200).ok();
    const bool completed = saved && env.FileExists("/ckpt").ok();
    if (kind == CrashKind::kPowerCut) {
      env.Crash();
    } else {
      env.SetCrashAfterOperations(MemEnv::kNoCrash);
      env.SetFilesystemActive(true);
    }

    auto latest = LatestCheckpoint(&env, "/ckpt");
    REQUIRE_MESSAGE(latest.ok(), latest.status().ToString());
    REQUIRE(latest->has_value());
    REQUIRE(**latest == kStep200);
    CheckRestores(&env, kStep200, 200);
    if (completed) return static_cast<int>(k) + 1;
  }
  FAIL("Save never completed");
  return 0;
}

TEST_CASE("a process kill or power cut while re-saving the same step with the same values keeps it restorable") {
  ::spdlog::level::level_enum level = internal::Logger().level();
  internal::Logger().set_level(::spdlog::level::err);
  for (CrashKind kind : {CrashKind::kProcessKill, CrashKind::kPowerCut}) {
    for (bool foreign_layout : {false, true}) {
      CAPTURE(static_cast<int>(kind));
      CAPTURE(foreign_layout);
      const int points = RunResaveSweep(kind, foreign_layout);
      MESSAGE("crash points tested (re-save): ", points);
      CHECK(points >= 1);
    }
  }
  internal::Logger().set_level(level);
}

TEST_CASE("a process kill while re-saving a step with new values: the previous checkpoint or DATA_LOSS, never nothing") {
  ::spdlog::level::level_enum level = internal::Logger().level();
  internal::Logger().set_level(::spdlog::level::err);
  for (bool with_previous : {true, false}) {
    CAPTURE(with_previous);
    for (int64_t k = 0; k < 10000; ++k) {
      CAPTURE(k);
      MemEnv env;
      ManualClock clock;
      REQUIRE(env.RecursivelyCreateDir("/ckpt").ok());
      SaverOptions o;
      o.env = &env;
      o.clock = &clock;
      auto saver = Saver::Create(o);
      REQUIRE(saver.ok());
      VariableStore vars;
      CreateVars(&vars);
      if (with_previous) {
        Fill(&vars, 1);
        REQUIRE((*saver)->Save(vars, "/ckpt/model.ckpt", 1).ok());
      }
      Fill(&vars, 2);
      REQUIRE((*saver)->Save(vars, "/ckpt/model.ckpt", 2).ok());
      REQUIRE(vars.Assign("w", *Tensor::FromVector<float>({-1, -2}, {2})).ok());   // not step 2's values
      env.SetCrashAfterOperations(k);
      const bool saved = (*saver)->Save(vars, "/ckpt/model.ckpt", 2).ok();
      const bool completed = saved && env.FileExists("/ckpt").ok();
      env.SetCrashAfterOperations(MemEnv::kNoCrash);
      env.SetFilesystemActive(true);

      auto latest = LatestCheckpoint(&env, "/ckpt");
      if (latest.ok()) {
        REQUIRE(latest->has_value());   // never a silent fresh start
        auto reader = BundleReader::Open(&env, **latest);
        REQUIRE(reader.ok());
        CHECK((*reader)->VerifyAll().ok());
      } else {
        CHECK(latest.status().code() == absl::StatusCode::kDataLoss);
        CHECK_FALSE(with_previous);   // the previous checkpoint is untouched
      }
      if (completed) break;
    }
  }
  internal::Logger().set_level(level);
}

TEST_CASE("a crash at any point of Save leaves the previous checkpoint or the new one, both restorable") {
  ::spdlog::level::level_enum level = internal::Logger().level();
  internal::Logger().set_level(::spdlog::level::err);   // the fallback warnings are expected here
  const int points = RunCrashSweep(/*max_to_keep=*/5);
  MESSAGE("crash points tested (max_to_keep 5): ", points);
  CHECK(points > 10);
  internal::Logger().set_level(level);
}

TEST_CASE("B130: a crash around the deletion of the oldest checkpoint never loses the listed one") {
  ::spdlog::level::level_enum level = internal::Logger().level();
  internal::Logger().set_level(::spdlog::level::err);
  const int points = RunCrashSweep(/*max_to_keep=*/1);
  MESSAGE("crash points tested (max_to_keep 1): ", points);
  CHECK(points > 10);
  internal::Logger().set_level(level);
}

}  // namespace
}  // namespace foreman
