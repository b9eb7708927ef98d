// The session-target registry (src/runtime/session_target.hpp): schemes
// registered from outside session.cpp, the unknown-scheme error, and the
// default "" / inproc:// targets.
#include "runtime/session_target.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <string>
#include <vector>

#include "foreman/session.hpp"

namespace foreman {
namespace {

using internal::RegisterSessionTarget;
using internal::RegisteredSessionTargetSchemes;
using internal::ResolveSessionTarget;
using internal::SessionValues;
using internal::UnregisterSessionTarget;

std::shared_ptr<Graph> OneVariableGraph() {
  auto graph = std::make_shared<Graph>();
  REQUIRE(graph->AddVariable("w", Tensor::Scalar<float>(1.0f)).ok());
  REQUIRE(graph->SetStep([](StepContext&) { return absl::OkStatus(); }).ok());
  return graph;
}

TEST_CASE("\"\" and inproc:// are registered by default") {
  const std::vector<std::string> schemes = RegisteredSessionTargetSchemes();
  REQUIRE(schemes.size() >= 2);
  CHECK(schemes[0].empty());
  CHECK(std::find(schemes.begin(), schemes.end(), "inproc://") != schemes.end());
}

TEST_CASE("A scheme registered outside session.cpp serves Session::Create, sharing its values") {
  auto shared = std::make_shared<SessionValues>();
  std::atomic<int> calls{0};
  std::string seen_target;
  REQUIRE(RegisterSessionTarget("test://", "\"test://ANY\"",
                                [&](const std::string& target) -> StatusOr<std::shared_ptr<SessionValues>> {
                                  ++calls;
                                  seen_target = target;
                                  if (target == "test://bad") return absl::InvalidArgumentError("bad test target");
                                  return shared;
                                })
              .ok());

  auto a = Session::Create(OneVariableGraph(), "test://x");
  auto b = Session::Create(OneVariableGraph(), "test://y");
  REQUIRE(a.ok());
  REQUIRE(b.ok());
  CHECK(calls == 2);
  CHECK(seen_target == "test://y");
  CHECK((*a)->target() == "test://x");
  // Both sessions see the factory's values: what one writes the other reads.
  REQUIRE((*a)->WithVariables([](VariableStore& vars) { return vars.Create("w", Tensor::Scalar<float>(7.0f)); }).ok());
  float read = 0;
  REQUIRE((*b)
              ->WithVariables([&](VariableStore& vars) -> Status {
                FOREMAN_ASSIGN_OR_RETURN(Tensor * w, vars.Get("w"));
                read = w->data<float>()[0];
                return absl::OkStatus();
              })
              .ok());
  CHECK(read == 7.0f);
  CHECK(shared->vars.Contains("w"));

  // The factory's own error reaches the caller unchanged.
  Status bad = Session::Create(OneVariableGraph(), "test://bad").status();
  CHECK(bad.code() == absl::StatusCode::kInvalidArgument);
  CHECK(bad.message() == "bad test target");

  // Registered twice: ALREADY_EXISTS naming it; a null factory: INVALID_ARGUMENT.
  Status twice = RegisterSessionTarget("test://", "", [&](const std::string&) { return shared; });
  CHECK(twice.code() == absl::StatusCode::kAlreadyExists);
  CHECK(twice.message().find("test://") != absl::string_view::npos);
  CHECK(RegisterSessionTarget("null://", "", nullptr).code() == absl::StatusCode::kInvalidArgument);

  // The unknown-scheme error lists the registered forms, the test's included.
  Status unknown = ResolveSessionTarget("tcp://localhost:2222").status();
  CHECK(unknown.code() == absl::StatusCode::kUnimplemented);
  CHECK(unknown.message() ==
        "session target 'tcp://localhost:2222' is not supported: use \"\" (local), \"inproc://NAME\" or "
        "\"test://ANY\"");

  CHECK(UnregisterSessionTarget("test://"));
  CHECK_FALSE(UnregisterSessionTarget("test://"));
  CHECK(Session::Create(OneVariableGraph(), "test://x").status().code() == absl::StatusCode::kUnimplemented);
  // The sessions created before keep their values.
  CHECK((*a)->UninitializedVariables().empty());
}

TEST_CASE("The longest registered scheme wins; \"\" matches only the empty target") {
  auto outer = std::make_shared<SessionValues>();
  auto inner = std::make_shared<SessionValues>();
  REQUIRE(RegisterSessionTarget("nest://", "\"nest://X\"", [&](const std::string&) { return outer; }).ok());
  REQUIRE(RegisterSessionTarget("nest://deep/", "\"nest://deep/X\"", [&](const std::string&) { return inner; }).ok());
  CHECK(*ResolveSessionTarget("nest://a") == outer);
  CHECK(*ResolveSessionTarget("nest://deep/a") == inner);
  CHECK(UnregisterSessionTarget("nest://deep/"));
  CHECK(UnregisterSessionTarget("nest://"));

  // A non-empty target that no scheme prefixes is not a local one.
  CHECK(ResolveSessionTarget("local").status().code() == absl::StatusCode::kUnimplemented);
  auto local1 = ResolveSessionTarget("");
  auto local2 = ResolveSessionTarget("");
  REQUIRE(local1.ok());
  REQUIRE(local2.ok());
  CHECK(*local1 != *local2);  // each local session has its own values
}

TEST_CASE("Unknown schemes are UNIMPLEMENTED, listing the registered targets") {
  Status s = Session::Create(OneVariableGraph(), "grpc://localhost:2222").status();
  CHECK(s.code() == absl::StatusCode::kUnimplemented);
  CHECK(s.message() ==
        "session target 'grpc://localhost:2222' is not supported: use \"\" (local) or \"inproc://NAME\"");
}

TEST_CASE("inproc:// targets share values by name until ResetInprocTarget") {
  const std::string target = "inproc://session_target_test";
  ResetInprocTarget(target);
  auto a = ResolveSessionTarget(target);
  auto b = ResolveSessionTarget(target);
  auto other = ResolveSessionTarget("inproc://session_target_test_other");
  REQUIRE(a.ok());
  REQUIRE(b.ok());
  REQUIRE(other.ok());
  CHECK(*a == *b);
  CHECK(*a != *other);
  CHECK(ResolveSessionTarget("inproc://").status().code() == absl::StatusCode::kInvalidArgument);

  CHECK(ResetInprocTarget(target));
  CHECK_FALSE(ResetInprocTarget(target));
  CHECK_FALSE(ResetInprocTarget("session_target_test"));
  auto fresh = ResolveSessionTarget(target);
  REQUIRE(fresh.ok());
  CHECK(*fresh != *a);
  ResetInprocTarget(target);
  ResetInprocTarget("inproc://session_target_test_other");
}

}  // namespace
}  // namespace foreman
