// foreman::VariableStore and the global_step helpers of TF's training_util
// (spec §10, B124-B125).
#include <doctest/doctest.h>

#include <limits>
#include <string>

#include "foreman/variable_store.hpp"

using foreman::DataType;
using foreman::Tensor;
using foreman::VariableStore;

TEST_CASE("variables are created once, found by name and listed sorted") {
  VariableStore vars;
  REQUIRE(vars.Create("dense/kernel", Tensor(DataType::kFloat, {784, 10})).ok());
  REQUIRE(vars.Create("dense/bias", Tensor(DataType::kFloat, {10})).ok());
  REQUIRE(vars.Create("dense/kernel/Adam", Tensor(DataType::kFloat, {784, 10}), false).ok());
  auto dup = vars.Create("dense/bias", Tensor(DataType::kFloat, {10}));
  CHECK(dup.code() == absl::StatusCode::kAlreadyExists);
  CHECK(std::string(dup.message()).find("dense/bias") != std::string::npos);
  CHECK(vars.Names() == std::vector<std::string>{"dense/bias", "dense/kernel", "dense/kernel/Adam"});
  CHECK(vars.TrainableNames() == std::vector<std::string>{"dense/bias", "dense/kernel"});
  CHECK(*vars.IsTrainable("dense/kernel/Adam") == false);
  CHECK(vars.TotalBytes() == (784 * 10 * 2 + 10) * sizeof(float));
}

TEST_CASE("a missing variable is NOT_FOUND naming it") {
  VariableStore vars;
  auto t = vars.Get("dense/kernel");
  REQUIRE_FALSE(t.ok());
  CHECK(t.status().code() == absl::StatusCode::kNotFound);
  CHECK(std::string(t.status().message()) == "variable 'dense/kernel' not found");
  CHECK(vars.Delete("x").code() == absl::StatusCode::kNotFound);
}

TEST_CASE("names must match TF's pattern") {
  VariableStore vars;
  for (const char* bad : {"", "/leading", "_under", "sp ace", "a:0", "tab\t"}) {
    auto s = vars.Create(bad, Tensor::Scalar<float>(0));
    CHECK_MESSAGE(s.code() == absl::StatusCode::kInvalidArgument, bad);
  }
  for (const char* good : {"w", "dense/kernel", "layer_1/bias", "a.b-c/d_e", "0start", ".hidden"}) {
    CHECK_MESSAGE(vars.Create(good, Tensor::Scalar<float>(0)).ok(), good);
  }
  CHECK(vars.Create("x", Tensor()).code() == absl::StatusCode::kInvalidArgument);
}

TEST_CASE("Get returns a stable pointer that writes through, and Assign checks dtype and shape") {
  VariableStore vars;
  REQUIRE(vars.Create("w", Tensor(DataType::kFloat, {2})).ok());
  Tensor* w = *vars.Get("w");
  for (int i = 0; i < 100; ++i) REQUIRE(vars.Create("v" + std::to_string(i), Tensor::Scalar<float>(0)).ok());
  CHECK(*vars.Get("w") == w);  // other inserts do not move it
  w->data<float>()[1] = 3.0f;
  CHECK((*vars.Get("w"))->data<float>()[1] == 3.0f);

  auto bad_shape = vars.Assign("w", Tensor(DataType::kFloat, {3}));
  CHECK(bad_shape.code() == absl::StatusCode::kInvalidArgument);
  CHECK(std::string(bad_shape.message()) == "assigning to variable 'w': expected shape [2], got [3]");
  auto bad_dtype = vars.Assign("w", Tensor(DataType::kDouble, {2}));
  CHECK(std::string(bad_dtype.message()) == "assigning to variable 'w': expected dtype float32, got float64");
  REQUIRE(vars.Assign("w", *Tensor::FromVector<float>({7, 8}, {2})).ok());
  CHECK(w->data<float>()[0] == 7.0f);
}

TEST_CASE("Snapshot is a deep copy that later updates do not change") {
  VariableStore vars;
  REQUIRE(vars.Create("w", Tensor::Scalar<float>(1)).ok());
  auto snap = vars.Snapshot();
  (*vars.Get("w"))->data<float>()[0] = 2;
  CHECK(*snap.at("w").scalar<float>() == 1.0f);
}

TEST_CASE("B125: CreateGlobalStep makes an int64 scalar, non-trainable, starting at 0, once") {
  VariableStore vars;
  REQUIRE(foreman::CreateGlobalStep(vars).ok());
  const Tensor* gs = *vars.Get("global_step");
  CHECK(gs->dtype() == DataType::kInt64);
  CHECK(gs->shape().rank() == 0);
  CHECK(*vars.IsTrainable("global_step") == false);
  CHECK(*foreman::GetGlobalStep(vars) == 0);
  auto again = foreman::CreateGlobalStep(vars);
  CHECK(again.code() == absl::StatusCode::kAlreadyExists);
  CHECK(again.message() == "global_step already exists.");
}

TEST_CASE("B124: GetGlobalStep is NOT_FOUND without one and INVALID_ARGUMENT for a non-integer or non-scalar") {
  VariableStore vars;
  CHECK(foreman::GetGlobalStep(vars).status().code() == absl::StatusCode::kNotFound);
  REQUIRE(vars.Create("global_step", Tensor::Scalar<float>(0)).ok());
  auto f = foreman::GetGlobalStep(vars);
  CHECK(f.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(std::string(f.status().message()) == "global_step must be an integer scalar, got float32[]");
  VariableStore vec;
  REQUIRE(vec.Create("global_step", Tensor(DataType::kInt64, {2})).ok());
  CHECK(foreman::GetGlobalStep(vec).status().code() == absl::StatusCode::kInvalidArgument);
}

TEST_CASE("B124: an int32 global_step written by TF is read as an integer") {
  VariableStore vars;
  REQUIRE(vars.Create("global_step", Tensor::Scalar<int32_t>(250), false).ok());
  CHECK(*foreman::GetGlobalStep(vars) == 250);
  CHECK(*foreman::IncrementGlobalStep(vars) == 251);
  CHECK(foreman::SetGlobalStep(vars, int64_t{1} << 40).code() == absl::StatusCode::kInvalidArgument);
}

TEST_CASE("B125: GetOrCreateGlobalStep creates once, then reads; Increment and Set update it") {
  VariableStore vars;
  CHECK(*foreman::GetOrCreateGlobalStep(vars) == 0);
  CHECK(*foreman::IncrementGlobalStep(vars) == 1);
  CHECK(*foreman::IncrementGlobalStep(vars, 10) == 11);
  CHECK(*foreman::GetOrCreateGlobalStep(vars) == 11);
  REQUIRE(foreman::SetGlobalStep(vars, 500).ok());
  CHECK(*foreman::GetGlobalStep(vars) == 500);
}

TEST_CASE("IncrementGlobalStep refuses to overflow int64 and leaves the step unchanged") {
  VariableStore vars;
  REQUIRE(foreman::CreateGlobalStep(vars).ok());
  REQUIRE(foreman::SetGlobalStep(vars, std::numeric_limits<int64_t>::max()).ok());
  auto next = foreman::IncrementGlobalStep(vars);
  CHECK(next.status().code() == absl::StatusCode::kFailedPrecondition);
  CHECK(*foreman::GetGlobalStep(vars) == std::numeric_limits<int64_t>::max());
}
