#include "foreman/graph.hpp"

#include <doctest/doctest.h>

#include "foreman/session.hpp"

namespace foreman {
namespace {

TEST_CASE("B125 CreateGlobalStep declares an int64 scalar global_step once") {
  Graph graph;
  REQUIRE(graph.CreateGlobalStep().ok());
  CHECK(graph.has_global_step());
  Status again = graph.CreateGlobalStep();
  CHECK(again.code() == absl::StatusCode::kAlreadyExists);
  CHECK(again.message() == "global_step already exists.");
  REQUIRE(graph.variables().size() == 1);
  const VariableDef& def = graph.variables()[0];
  CHECK(def.name == "global_step");
  CHECK_FALSE(def.trainable);
  StatusOr<Tensor> initial = def.initializer();
  REQUIRE(initial.ok());
  CHECK(initial->dtype() == DataType::kInt64);
  CHECK(initial->shape().dims().empty());
}

TEST_CASE("B124 a graph without global_step reports none") {
  Graph graph;
  REQUIRE(graph.AddVariable("w", Tensor(DataType::kFloat, {2})).ok());
  CHECK_FALSE(graph.has_global_step());
  // A *local* variable named global_step is not TF's global step.
  Graph local;
  REQUIRE(local.AddLocalVariable("global_step", Tensor::Scalar<int64_t>(0)).ok());
  CHECK_FALSE(local.has_global_step());
}

TEST_CASE("B21 a finalized graph refuses changes; Unfinalize (B22) allows them again") {
  Graph graph;
  REQUIRE(graph.AddVariable("a", Tensor(DataType::kFloat, {1})).ok());
  graph.Finalize();
  CHECK(graph.finalized());
  for (Status s : {graph.AddVariable("b", Tensor(DataType::kFloat, {1})), graph.CreateGlobalStep(),
                   graph.SetStep([](StepContext&) { return absl::OkStatus(); }), graph.AddSummaryOp("s")}) {
    CHECK(s.code() == absl::StatusCode::kFailedPrecondition);
    CHECK(s.message() == "Graph is finalized and cannot be modified.");
  }
  graph.Unfinalize();
  CHECK(graph.AddVariable("b", Tensor(DataType::kFloat, {1})).ok());
}

TEST_CASE("Graph rejects bad variable declarations with the name") {
  Graph graph;
  CHECK(graph.AddVariable("bad name", Tensor(DataType::kFloat, {1})).code() == absl::StatusCode::kInvalidArgument);
  CHECK(graph.AddVariable("x", Tensor()).code() == absl::StatusCode::kInvalidArgument);
  CHECK(graph.AddVariable("x", Initializer()).code() == absl::StatusCode::kInvalidArgument);
  REQUIRE(graph.AddVariable("x", Tensor(DataType::kFloat, {1})).ok());
  Status dup = graph.AddVariable("x", Tensor(DataType::kFloat, {1}));
  CHECK(dup.code() == absl::StatusCode::kAlreadyExists);
  CHECK(dup.message().find("'x'") != absl::string_view::npos);
}

TEST_CASE("Graph lists global and local variables apart, sorted; summary ops deduplicated") {
  Graph graph;
  REQUIRE(graph.AddVariable("z", Tensor(DataType::kFloat, {1})).ok());
  REQUIRE(graph.AddVariable("a", Tensor(DataType::kFloat, {1}), /*trainable=*/false).ok());
  REQUIRE(graph.AddLocalVariable("epoch_position", Tensor::Scalar<int64_t>(0)).ok());
  CHECK(graph.GlobalVariableNames() == std::vector<std::string>{"a", "z"});
  CHECK(graph.LocalVariableNames() == std::vector<std::string>{"epoch_position"});
  REQUIRE(graph.AddSummaryOp("summaries").ok());
  REQUIRE(graph.AddSummaryOp("summaries").ok());
  REQUIRE(graph.AddSummaryOp("histograms").ok());
  CHECK(graph.summary_ops() == std::vector<std::string>{"summaries", "histograms"});
}

TEST_CASE("An initializer runs each time it is called (a fresh value per session)") {
  Graph graph;
  int calls = 0;
  REQUIRE(graph.AddVariable("r", Initializer([&calls]() -> StatusOr<Tensor> {
                                    ++calls;
                                    return Tensor::Scalar<float>(static_cast<float>(calls));
                                  }))
              .ok());
  CHECK(graph.variables()[0].initializer()->scalar<float>().value() == 1.0f);
  CHECK(graph.variables()[0].initializer()->scalar<float>().value() == 2.0f);
}

}  // namespace
}  // namespace foreman
