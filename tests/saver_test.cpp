// Tests for Saver and LatestCheckpoint (include/foreman/checkpoint.hpp):
// naming (B127-B129), retention (B130-B133, H-21, H-23, H-24, B84), restore
// (B134) and the choice of the checkpoint to restore (B140, decision 7).
#include <doctest/doctest.h>

#include <algorithm>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include <spdlog/sinks/ostream_sink.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "foreman/bundle.hpp"
#include "foreman/checkpoint.hpp"
#include "foreman/mem_env.hpp"
#include "platform/log.hpp"
#include "support/log_capture.hpp"

namespace foreman {
namespace {

using Paths = std::vector<std::string>;

std::string Msg(const Status& s) { return std::string(s.message()); }

CheckpointState State(const std::string& latest, Paths all = {}) {
  CheckpointState s;
  s.model_checkpoint_path = latest;
  s.all_model_checkpoint_paths = std::move(all);
  return s;
}

using foreman::testing::CapturedLog;

/// A MemEnv with /ckpt, a manual clock, and a store {w: float32[2], global_step}.
struct Fixture {
  Fixture() {
    REQUIRE(env.RecursivelyCreateDir("/ckpt").ok());
    REQUIRE(vars.Create("w", *Tensor::FromVector<float>({1, 2}, {2})).ok());
    REQUIRE(CreateGlobalStep(vars).ok());
  }

  std::unique_ptr<Saver> NewSaver(SaverOptions o = {}) {
    o.env = &env;
    o.clock = &clock;
    auto s = Saver::Create(o);
    REQUIRE_MESSAGE(s.ok(), s.status().ToString());
    return *std::move(s);
  }

  std::string Save(Saver& saver, int64_t step) {
    REQUIRE(SetGlobalStep(vars, step).ok());
    auto p = saver.Save(vars, "/ckpt/model.ckpt", step);
    REQUIRE_MESSAGE(p.ok(), p.status().ToString());
    return *p;
  }

  /// Steps of the bundles on disk, oldest first.
  std::vector<int64_t> StepsOnDisk() {
    auto prefixes = ListCheckpointPrefixes(&env, "/ckpt");
    REQUIRE(prefixes.ok());
    std::vector<int64_t> steps;
    for (const std::string& p : *prefixes) steps.push_back(std::stoll(p.substr(p.rfind('-') + 1)));
    return steps;
  }

  /// The state file's paths.
  Paths Listed() {
    auto s = ReadCheckpointState(&env, "/ckpt");
    REQUIRE(s.ok());
    REQUIRE(s->has_value());
    CHECK((*s)->model_checkpoint_path == (*s)->all_model_checkpoint_paths.back());
    return (*s)->all_model_checkpoint_paths;
  }

  /// "model.ckpt-<n>" for each step.
  static Paths Names(std::initializer_list<int> steps) {
    Paths out;
    for (int s : steps) out.push_back(absl::StrCat("model.ckpt-", s));
    return out;
  }

  float W(int i) { return (*vars.Get("w"))->data<float>()[i]; }

  MemEnv env;
  ManualClock clock;
  VariableStore vars;
};

// -- naming ------------------------------------------------------------------------

TEST_CASE("B127/B128: Save writes <save_path>-<step>.index and .data, -%08d with pad_step_number") {
  Fixture f;
  auto saver = f.NewSaver();
  CHECK(f.Save(*saver, 100) == "/ckpt/model.ckpt-100");
  CHECK(f.env.FileExists("/ckpt/model.ckpt-100.index").ok());
  CHECK(f.env.FileExists("/ckpt/model.ckpt-100.data-00000-of-00001").ok());

  SaverOptions padded;
  padded.pad_step_number = true;
  auto p = f.NewSaver(padded)->Save(f.vars, "/ckpt/model.ckpt", 7);
  REQUIRE(p.ok());
  CHECK(*p == "/ckpt/model.ckpt-00000007");

  auto plain = saver->Save(f.vars, "/ckpt/final", std::nullopt);
  REQUIRE(plain.ok());
  CHECK(*plain == "/ckpt/final");
  CHECK(f.env.FileExists("/ckpt/final.index").ok());
  CHECK(f.Listed() == Paths{"model.ckpt-100", "final"});
}

TEST_CASE("B129/B135: bad latest_filename, a save path on the state file, a missing directory") {
  Fixture f;
  auto saver = f.NewSaver();
  auto slash = saver->Save(f.vars, "/ckpt/model.ckpt", 1, "sub/checkpoint");
  CHECK(slash.status().code() == absl::StatusCode::kInvalidArgument);
  auto clash = saver->Save(f.vars, "/ckpt/checkpoint", std::nullopt);
  CHECK(clash.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(Msg(clash.status()) == "Save path '/ckpt/checkpoint' conflicts with path used for checkpoint state");
  CHECK(saver->Save(f.vars, "/ckpt/latest", std::nullopt, "latest").status().code() ==
        absl::StatusCode::kInvalidArgument);
  auto missing = saver->Save(f.vars, "/nope/model.ckpt", 1);
  CHECK(missing.status().code() == absl::StatusCode::kNotFound);
  CHECK(Msg(missing.status()) == "Parent directory of /nope/model.ckpt doesn't exist, can't save.");
  CHECK(f.env.GetChildren("/ckpt")->empty());
}

TEST_CASE("Saver::Create rejects a negative max_to_keep and a non-positive keep interval") {
  SaverOptions o;
  o.max_to_keep = -1;
  CHECK(Saver::Create(o).status().code() == absl::StatusCode::kInvalidArgument);
  o.max_to_keep = 5;
  o.keep_checkpoint_every_n_hours = 0;
  CHECK(Saver::Create(o).status().code() == absl::StatusCode::kInvalidArgument);
}

// -- retention ---------------------------------------------------------------------

TEST_CASE("B130: re-saving the same step moves it to the end of the list") {
  Fixture f;
  auto saver = f.NewSaver();
  for (int step : {1, 2, 3, 1}) f.Save(*saver, step);
  CHECK(f.Listed() == Fixture::Names({2, 3, 1}));
  CHECK(saver->last_checkpoints() == Paths{"/ckpt/model.ckpt-2", "/ckpt/model.ckpt-3", "/ckpt/model.ckpt-1"});
  auto latest = LatestCheckpoint(&f.env, "/ckpt");
  REQUIRE(latest.ok());
  CHECK(**latest == "/ckpt/model.ckpt-1");
}

TEST_CASE("H-23/B130: max_to_keep 5 over 8 saves keeps the last 5, deleting one per save") {
  Fixture f;
  auto saver = f.NewSaver();
  for (int step = 1; step <= 8; ++step) {
    f.Save(*saver, step);
    CHECK(f.StepsOnDisk().size() == static_cast<std::size_t>(std::min(step, 5)));
  }
  CHECK(f.StepsOnDisk() == std::vector<int64_t>{4, 5, 6, 7, 8});
  CHECK(f.Listed() == Fixture::Names({4, 5, 6, 7, 8}));
  CHECK(f.env.FileExists("/ckpt/model.ckpt-3.data-00000-of-00001").code() == absl::StatusCode::kNotFound);
}

TEST_CASE("B130: at most one checkpoint is deleted per save, even when several are beyond max_to_keep") {
  Fixture f;
  auto first = f.NewSaver();
  for (int step : {1, 2, 3, 4}) f.Save(*first, step);
  SaverOptions two;
  two.max_to_keep = 2;
  auto saver = f.NewSaver(two);
  saver->RecoverLastCheckpoints("/ckpt", f.Listed());
  f.Save(*saver, 5);
  CHECK(f.StepsOnDisk() == std::vector<int64_t>{2, 3, 4, 5});
  f.Save(*saver, 6);
  CHECK(f.StepsOnDisk() == std::vector<int64_t>{3, 4, 5, 6});
}

TEST_CASE("B131: max_to_keep 0 keeps every file but the state file lists only the latest") {
  Fixture f;
  SaverOptions all;
  all.max_to_keep = 0;
  auto saver = f.NewSaver(all);
  for (int step = 1; step <= 7; ++step) f.Save(*saver, step);
  CHECK(f.StepsOnDisk().size() == 7);
  CHECK(f.Listed() == Fixture::Names({7}));
  CHECK(saver->last_checkpoints().empty());
}

TEST_CASE("H-24/B132: keep_checkpoint_every_n_hours keeps checkpoints on disk but out of the state file") {
  Fixture f;
  SaverOptions o;
  o.max_to_keep = 2;
  o.keep_checkpoint_every_n_hours = 1.0 / 3600;   // one second
  auto saver = f.NewSaver(o);
  for (int step = 1; step <= 5; ++step) {
    f.clock.Advance(absl::Milliseconds(600));
    f.Save(*saver, step);
    CHECK(f.Listed().size() <= 2);
  }
  // Saved at 0.6, 1.2, 1.8, 2.4, 3.0 s; first keep time 1 s, then 2 s: step 2
  // is kept for good, steps 1 and 3 are deleted.
  CHECK(f.StepsOnDisk() == std::vector<int64_t>{2, 4, 5});
  CHECK(f.Listed() == Fixture::Names({4, 5}));
}

TEST_CASE("B133: deletion removes .index, every .data shard and .meta; failures are logged and ignored") {
  Fixture f;
  SaverOptions one;
  one.max_to_keep = 1;
  auto saver = f.NewSaver(one);
  f.Save(*saver, 1);
  REQUIRE(WriteStringToFile(&f.env, "/ckpt/model.ckpt-1.meta", "graph").ok());
  REQUIRE(WriteStringToFile(&f.env, "/ckpt/model.ckpt-1.data-00001-of-00002", "x").ok());
  f.Save(*saver, 2);
  CHECK(*f.env.GetChildren("/ckpt") ==
        Paths{"checkpoint", "model.ckpt-2.data-00000-of-00001", "model.ckpt-2.index"});

  REQUIRE(f.env.CreateDir("/ckpt/model.ckpt-2.meta").ok());   // cannot be deleted as a file
  CapturedLog log;
  f.Save(*saver, 3);
  CHECK(absl::StrContains(log.text(), "Ignoring: "));
  CHECK(absl::StrContains(log.text(), "model.ckpt-2.meta"));
  CHECK(f.StepsOnDisk() == std::vector<int64_t>{3});
  CHECK(f.Listed() == Fixture::Names({3}));
}

TEST_CASE("H-21/B84: RecoverLastCheckpoints continues retention across a new Saver") {
  Fixture f;
  SaverOptions two;
  two.max_to_keep = 2;
  {
    auto run1 = f.NewSaver(two);
    for (int step : {10, 20, 30}) f.Save(*run1, step);
    CHECK(f.StepsOnDisk() == std::vector<int64_t>{20, 30});
  }
  auto run2 = f.NewSaver(two);
  auto state = ReadCheckpointState(&f.env, "/ckpt");
  REQUIRE(state.ok());
  run2->RecoverLastCheckpoints("/ckpt", (*state)->all_model_checkpoint_paths);
  CHECK(run2->last_checkpoints() == Paths{"/ckpt/model.ckpt-20", "/ckpt/model.ckpt-30"});
  for (int step : {30, 40, 50}) f.Save(*run2, step);
  CHECK(f.StepsOnDisk() == std::vector<int64_t>{40, 50});
  CHECK(f.Listed() == Fixture::Names({40, 50}));
}

TEST_CASE("H-21: without recovery a new Saver orphans the previous run's files (TF's behaviour)") {
  Fixture f;
  SaverOptions two;
  two.max_to_keep = 2;
  for (int step : {10, 20, 30}) f.Save(*f.NewSaver(two), step);   // a fresh saver each time: nothing deleted
  auto run2 = f.NewSaver(two);
  for (int step : {40, 50, 60}) f.Save(*run2, step);
  CHECK(f.StepsOnDisk() == std::vector<int64_t>{10, 20, 30, 50, 60});
  CHECK(f.Listed() == Fixture::Names({50, 60}));
}

TEST_CASE("B84: RecoverLastCheckpoints drops paths whose files are gone") {
  Fixture f;
  auto saver = f.NewSaver();
  for (int step : {1, 2}) f.Save(*saver, step);
  auto fresh = f.NewSaver();
  fresh->RecoverLastCheckpoints("/ckpt", {"model.ckpt-1", "model.ckpt-2", "model.ckpt-99", "/elsewhere/m-1"});
  CHECK(fresh->last_checkpoints() == Paths{"/ckpt/model.ckpt-1", "/ckpt/model.ckpt-2"});
}

TEST_CASE("B136/B142: the state file carries each checkpoint's save time and last_preserved_timestamp") {
  Fixture f;   // the clock starts at 1700000000 s
  SaverOptions o;
  o.max_to_keep = 2;
  o.keep_checkpoint_every_n_hours = 1;
  auto saver = f.NewSaver(o);
  for (int step : {1, 2, 3}) {
    f.clock.Advance(absl::Seconds(100));
    f.Save(*saver, step);
  }
  auto state = ReadCheckpointState(&f.env, "/ckpt");
  REQUIRE(state.ok());
  REQUIRE(state->has_value());
  CHECK((*state)->all_model_checkpoint_paths == Fixture::Names({2, 3}));
  CHECK((*state)->all_model_checkpoint_timestamps == std::vector<double>{1700000200, 1700000300});
  CHECK((*state)->last_preserved_timestamp == 1700000000);   // the Saver's creation: nothing kept yet
  // TF's text format, in TF's field order.
  auto text = f.env.ReadFileToString("/ckpt/checkpoint");
  REQUIRE(text.ok());
  CHECK(*text ==
        "model_checkpoint_path: \"model.ckpt-3\"\n"
        "all_model_checkpoint_paths: \"model.ckpt-2\"\n"
        "all_model_checkpoint_paths: \"model.ckpt-3\"\n"
        "all_model_checkpoint_timestamps: 1700000200\n"
        "all_model_checkpoint_timestamps: 1700000300\n"
        "last_preserved_timestamp: 1700000000\n");
}

TEST_CASE("B132/B142: a checkpoint keep_checkpoint_every_n_hours keeps is kept across a restart") {
  Fixture f;
  SaverOptions o;
  o.max_to_keep = 1;
  o.keep_checkpoint_every_n_hours = 1;
  {
    auto run1 = f.NewSaver(o);   // created at t0: the first keep time is t0 + 1 h
    f.clock.Advance(absl::Seconds(3700));
    f.Save(*run1, 1);            // saved after the keep time
  }
  f.clock.Advance(absl::Seconds(100));
  auto run2 = f.NewSaver(o);     // a fresh Saver alone would count from t0 + 3800 s
  auto state = ReadCheckpointState(&f.env, "/ckpt");
  REQUIRE(state.ok());
  REQUIRE(state->has_value());
  run2->RecoverLastCheckpoints("/ckpt", **state);
  CHECK(run2->last_checkpoints() == Paths{"/ckpt/model.ckpt-1"});
  f.clock.Advance(absl::Seconds(100));
  f.Save(*run2, 2);              // 1 leaves the window: run 1's schedule keeps it
  f.Save(*run2, 3);              // 2 leaves it too: saved before the next keep time (t0 + 2 h)
  CHECK(f.StepsOnDisk() == std::vector<int64_t>{1, 3});
  CHECK(f.Listed() == Fixture::Names({3}));
  auto after = ReadCheckpointState(&f.env, "/ckpt");
  REQUIRE(after.ok());
  CHECK((*after)->last_preserved_timestamp == 1700000000 + 3600);   // the interval now runs from t0 + 1 h
}

TEST_CASE("B84: a state file without timestamps (TF's Saver, older Foreman) recovers as before") {
  Fixture f;
  SaverOptions o;
  o.max_to_keep = 1;
  o.keep_checkpoint_every_n_hours = 1;
  {
    auto run1 = f.NewSaver(o);
    f.clock.Advance(absl::Seconds(3700));
    f.Save(*run1, 1);
  }
  REQUIRE(WriteStringToFile(&f.env, "/ckpt/checkpoint",
                            "model_checkpoint_path: \"model.ckpt-1\"\n"
                            "all_model_checkpoint_paths: \"model.ckpt-1\"\n").ok());
  auto run2 = f.NewSaver(o);
  auto state = ReadCheckpointState(&f.env, "/ckpt");
  REQUIRE(state.ok());
  REQUIRE(state->has_value());
  run2->RecoverLastCheckpoints("/ckpt", **state);
  CHECK(run2->last_checkpoints() == Paths{"/ckpt/model.ckpt-1"});
  f.Save(*run2, 2);   // no save times: 1 counts as older than run 2's keep schedule, and goes
  f.Save(*run2, 3);
  CHECK(f.StepsOnDisk() == std::vector<int64_t>{3});
}

// -- restore ------------------------------------------------------------------------

TEST_CASE("B134: Restore assigns every variable from the checkpoint") {
  Fixture f;
  auto saver = f.NewSaver();
  const std::string prefix = f.Save(*saver, 42);
  REQUIRE(f.vars.Assign("w", *Tensor::FromVector<float>({-1, -2}, {2})).ok());
  REQUIRE(SetGlobalStep(f.vars, 0).ok());
  REQUIRE(saver->Restore(prefix, &f.vars).ok());
  CHECK(f.W(0) == 1.0f);
  CHECK(f.W(1) == 2.0f);
  CHECK(*GetGlobalStep(f.vars) == 42);
}

TEST_CASE("B134: Restore with a name_map reads checkpoint keys into differently named variables") {
  Fixture f;
  auto saver = f.NewSaver();
  std::map<std::string, Tensor> tf2 = {
      {"dense/kernel/.ATTRIBUTES/VARIABLE_VALUE", *Tensor::FromVector<float>({7, 8}, {2})},
      {"_CHECKPOINTABLE_OBJECT_GRAPH", Tensor::Scalar<std::string>("graph")}};
  auto prefix = saver->Save(tf2, "/ckpt/ckpt", 1);
  REQUIRE(prefix.ok());
  REQUIRE(saver->Restore(*prefix, &f.vars, {{"w", "dense/kernel/.ATTRIBUTES/VARIABLE_VALUE"}}).ok());
  CHECK(f.W(0) == 7.0f);
  CHECK(*GetGlobalStep(f.vars) == 0);   // not in the map: untouched
}

TEST_CASE("B134: restore errors name what is wrong and leave every variable unchanged") {
  Fixture f;
  auto saver = f.NewSaver();
  std::map<std::string, Tensor> other = {{"global_step", Tensor::Scalar<int64_t>(9)},
                                         {"w", *Tensor::FromVector<float>({5, 6, 7}, {3})}};
  const std::string prefix = *saver->Save(other, "/ckpt/other", std::nullopt);

  auto check_unchanged = [&] {
    CHECK(f.W(0) == 1.0f);
    CHECK(*GetGlobalStep(f.vars) == 0);
  };
  Status shape = saver->Restore(prefix, &f.vars);
  CHECK(shape.code() == absl::StatusCode::kInvalidArgument);
  CHECK(absl::StrContains(Msg(shape), "'w'"));
  CHECK(absl::StrContains(Msg(shape), "float32[2]"));
  CHECK(absl::StrContains(Msg(shape), "float32[3]"));
  check_unchanged();

  REQUIRE(f.vars.Create("bias", Tensor::Scalar(0.5f)).ok());
  Status missing = saver->Restore(prefix, &f.vars, {{"global_step", "global_step"}, {"bias", "bias"}});
  CHECK(missing.code() == absl::StatusCode::kNotFound);
  CHECK(absl::StrContains(Msg(missing), "'bias'"));
  CHECK(absl::StrContains(Msg(missing), prefix));
  check_unchanged();

  Status dtype = saver->Restore(prefix, &f.vars, {{"bias", "global_step"}});
  CHECK(dtype.code() == absl::StatusCode::kInvalidArgument);
  CHECK(absl::StrContains(Msg(dtype), "int64"));

  Status invalid = saver->Restore("/ckpt/nothing", &f.vars);
  CHECK(invalid.code() == absl::StatusCode::kInvalidArgument);
  CHECK(Msg(invalid) == "The passed save_path is not a valid checkpoint: /ckpt/nothing");

  // A corrupt tensor after a good one: DATA_LOSS, and the good one is not assigned either.
  const std::string good = f.Save(*saver, 5);
  std::string data = *f.env.ReadFileToString(BundleDataPath(good));
  data.back() ^= 1;   // "w" sorts after "global_step"
  REQUIRE(WriteStringToFile(&f.env, BundleDataPath(good), data).ok());
  REQUIRE(SetGlobalStep(f.vars, 0).ok());
  Status loss = saver->Restore(good, &f.vars);
  CHECK(loss.code() == absl::StatusCode::kDataLoss);
  CHECK(absl::StrContains(Msg(loss), BundleDataPath(good)));
  CHECK(absl::StrContains(Msg(loss), "'w'"));
  check_unchanged();
}

// -- which checkpoint to restore (decision 7) ---------------------------------------

TEST_CASE("B140: LatestCheckpoint returns the state file's latest when it verifies; nullopt without any") {
  Fixture f;
  auto none = LatestCheckpoint(&f.env, "/ckpt");
  REQUIRE(none.ok());
  CHECK_FALSE(none->has_value());
  auto missing_dir = LatestCheckpoint(&f.env, "/nowhere");
  REQUIRE(missing_dir.ok());
  CHECK_FALSE(missing_dir->has_value());

  auto saver = f.NewSaver();
  f.Save(*saver, 1);
  f.Save(*saver, 2);
  CapturedLog log;
  auto latest = LatestCheckpoint(&f.env, "/ckpt");
  REQUIRE(latest.ok());
  CHECK(**latest == "/ckpt/model.ckpt-2");
  CHECK(log.text().empty());
}

TEST_CASE("decision 7: a corrupt latest checkpoint falls back to the previous one, with a warning") {
  Fixture f;
  auto saver = f.NewSaver();
  f.Save(*saver, 1);
  f.Save(*saver, 2);
  std::string data = *f.env.ReadFileToString("/ckpt/model.ckpt-2.data-00000-of-00001");
  data[0] ^= 0x20;
  REQUIRE(WriteStringToFile(&f.env, "/ckpt/model.ckpt-2.data-00000-of-00001", data).ok());
  CapturedLog log;
  auto latest = LatestCheckpoint(&f.env, "/ckpt");
  REQUIRE(latest.ok());
  CHECK(**latest == "/ckpt/model.ckpt-1");
  CHECK(absl::StrContains(log.text(), "/ckpt/model.ckpt-2.data-00000-of-00001"));
  CHECK(absl::StrContains(log.text(), "Using /ckpt/model.ckpt-1"));
}

TEST_CASE("decision 7: a dangling state entry, a missing or unparsable state file fall back to the files") {
  Fixture f;
  auto saver = f.NewSaver();
  f.Save(*saver, 1);
  f.Save(*saver, 2);
  {
    REQUIRE(f.env.DeleteFile("/ckpt/model.ckpt-2.index").ok());   // dangling: B140's "Couldn't match files"
    CapturedLog log;
    auto latest = LatestCheckpoint(&f.env, "/ckpt");
    REQUIRE(latest.ok());
    CHECK(**latest == "/ckpt/model.ckpt-1");
    CHECK(absl::StrContains(log.text(), "/ckpt/model.ckpt-2.index"));
  }
  {
    REQUIRE(WriteStringToFile(&f.env, "/ckpt/checkpoint", "model_checkpoint_path: {{{").ok());
    CapturedLog log;
    auto latest = LatestCheckpoint(&f.env, "/ckpt");
    REQUIRE(latest.ok());
    CHECK(**latest == "/ckpt/model.ckpt-1");
    CHECK(absl::StrContains(log.text(), "/ckpt/checkpoint"));
  }
  {
    REQUIRE(f.env.DeleteFile("/ckpt/checkpoint").ok());
    auto latest = LatestCheckpoint(&f.env, "/ckpt");
    REQUIRE(latest.ok());
    CHECK(**latest == "/ckpt/model.ckpt-1");
  }
}

TEST_CASE("decision 7: DATA_LOSS naming the directory when checkpoints exist and none verifies") {
  Fixture f;
  auto saver = f.NewSaver();
  f.Save(*saver, 1);
  f.Save(*saver, 2);
  for (const char* p : {"/ckpt/model.ckpt-1", "/ckpt/model.ckpt-2"}) {
    std::string data = *f.env.ReadFileToString(BundleDataPath(p));
    data[1] ^= 1;
    REQUIRE(WriteStringToFile(&f.env, BundleDataPath(p), data).ok());
  }
  CapturedLog log;
  auto latest = LatestCheckpoint(&f.env, "/ckpt");
  CHECK(latest.status().code() == absl::StatusCode::kDataLoss);
  CHECK(absl::StrContains(Msg(latest.status()), "/ckpt"));
  CHECK(absl::StrContains(Msg(latest.status()), "model.ckpt-1.data"));
  CHECK(absl::StrContains(Msg(latest.status()), "model.ckpt-2.data"));
}

TEST_CASE("decision 7: a state file naming a corrupt bundle outside the directory is DATA_LOSS, not a fresh start") {
  Fixture f;
  REQUIRE(f.env.RecursivelyCreateDir("/elsewhere").ok());
  auto saver = f.NewSaver();
  REQUIRE(saver->Save(f.vars, "/elsewhere/model.ckpt", 5).ok());
  REQUIRE(saver->Save(f.vars, "/elsewhere/model.ckpt", 6).ok());
  std::string data = *f.env.ReadFileToString(BundleDataPath("/elsewhere/model.ckpt-6"));
  data[0] ^= 1;
  REQUIRE(WriteStringToFile(&f.env, BundleDataPath("/elsewhere/model.ckpt-6"), data).ok());
  REQUIRE(WriteCheckpointState(&f.env, "/ckpt", State("/elsewhere/model.ckpt-6")).ok());
  CapturedLog log;
  auto latest = LatestCheckpoint(&f.env, "/ckpt");   // no bundle in /ckpt itself
  CHECK(latest.status().code() == absl::StatusCode::kDataLoss);
  CHECK(absl::StrContains(Msg(latest.status()), "/elsewhere/model.ckpt-6.data-00000-of-00001"));

  // Another listed checkpoint there that verifies is the fallback.
  REQUIRE(WriteCheckpointState(&f.env, "/ckpt",
                               State("/elsewhere/model.ckpt-6", {"/elsewhere/model.ckpt-5", "/elsewhere/model.ckpt-6"}))
              .ok());
  latest = LatestCheckpoint(&f.env, "/ckpt");
  REQUIRE_MESSAGE(latest.ok(), latest.status().ToString());
  CHECK(**latest == "/elsewhere/model.ckpt-5");

  // Listed but corrupt too: DATA_LOSS naming both.
  data = *f.env.ReadFileToString(BundleDataPath("/elsewhere/model.ckpt-5"));
  data[0] ^= 1;
  REQUIRE(WriteStringToFile(&f.env, BundleDataPath("/elsewhere/model.ckpt-5"), data).ok());
  latest = LatestCheckpoint(&f.env, "/ckpt");
  CHECK(latest.status().code() == absl::StatusCode::kDataLoss);
  CHECK(absl::StrContains(Msg(latest.status()), "/elsewhere/model.ckpt-5.data"));
  CHECK(absl::StrContains(Msg(latest.status()), "/elsewhere/model.ckpt-6.data"));

  // A state file naming only bundles that are gone, with none on disk: nothing to restore.
  REQUIRE(WriteCheckpointState(&f.env, "/ckpt", State("/elsewhere/model.ckpt-7")).ok());
  latest = LatestCheckpoint(&f.env, "/ckpt");
  REQUIRE(latest.ok());
  CHECK_FALSE(latest->has_value());
}

TEST_CASE("re-saving a step whose bundle already holds the same tensors keeps the bundle as it is") {
  Fixture f;
  // The bundle as another writer laid it out (TF orders the data file its own
  // way): w before global_step, where the Saver writes them sorted.
  REQUIRE(SetGlobalStep(f.vars, 200).ok());
  {
    auto w = BundleWriter::Create(&f.env, "/ckpt/model.ckpt-200");
    REQUIRE(w.ok());
    REQUIRE((*w)->Add("w", **f.vars.Get("w")).ok());
    REQUIRE((*w)->Add("global_step", **f.vars.Get("global_step")).ok());
    REQUIRE((*w)->Finish().ok());
  }
  const std::string data = *f.env.ReadFileToString(BundleDataPath("/ckpt/model.ckpt-200"));
  const std::string index = *f.env.ReadFileToString("/ckpt/model.ckpt-200.index");
  auto saver = f.NewSaver();
  CHECK(f.Save(*saver, 200) == "/ckpt/model.ckpt-200");
  CHECK(*f.env.ReadFileToString(BundleDataPath("/ckpt/model.ckpt-200")) == data);
  CHECK(*f.env.ReadFileToString("/ckpt/model.ckpt-200.index") == index);
  CHECK(f.Listed() == Fixture::Names({200}));

  // Different values are written.
  REQUIRE(f.vars.Assign("w", *Tensor::FromVector<float>({7, 8}, {2})).ok());
  f.Save(*saver, 200);
  CHECK(*f.env.ReadFileToString(BundleDataPath("/ckpt/model.ckpt-200")) != data);
  auto r = BundleReader::Open(&f.env, "/ckpt/model.ckpt-200");
  REQUIRE(r.ok());
  CHECK((*r)->Lookup("w")->Equals(*Tensor::FromVector<float>({7, 8}, {2})));
  // As is a corrupt bundle, or one with another set of tensors.
  std::string bad = *f.env.ReadFileToString(BundleDataPath("/ckpt/model.ckpt-200"));
  bad[0] ^= 1;
  REQUIRE(WriteStringToFile(&f.env, BundleDataPath("/ckpt/model.ckpt-200"), bad).ok());
  f.Save(*saver, 200);
  CHECK(BundleReader::Open(&f.env, "/ckpt/model.ckpt-200").value()->VerifyAll().ok());
  REQUIRE(f.vars.Create("extra", Tensor::Scalar<int32_t>(1)).ok());
  f.Save(*saver, 200);
  CHECK(BundleReader::Open(&f.env, "/ckpt/model.ckpt-200").value()->Contains("extra"));
}

}  // namespace
}  // namespace foreman
