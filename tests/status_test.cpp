// foreman::Status helpers: the macros, exception conversion (spec §17.12),
// annotation and TF's NanLossDuringTrainingError.
#include <doctest/doctest.h>

#include <new>
#include <stdexcept>
#include <string>

#include "foreman/status.hpp"

using foreman::Status;
using foreman::StatusOr;

namespace {

Status FailIf(bool fail, int* reached) {
  FOREMAN_RETURN_IF_ERROR(fail ? absl::DataLossError("bad crc") : absl::OkStatus());
  ++*reached;
  return absl::OkStatus();
}

StatusOr<int> Half(int x) {
  if (x % 2 != 0) return absl::InvalidArgumentError("odd");
  return x / 2;
}

StatusOr<int> Quarter(int x) {
  FOREMAN_ASSIGN_OR_RETURN(int h, Half(x));
  FOREMAN_ASSIGN_OR_RETURN(int q, Half(h));
  return q;
}

bool Contains(const Status& s, const std::string& needle) {
  return std::string(s.message()).find(needle) != std::string::npos;
}

}  // namespace

TEST_CASE("TF's canonical codes have the numbers of error_codes.proto") {
  CHECK(static_cast<int>(absl::StatusCode::kCancelled) == 1);
  CHECK(static_cast<int>(absl::StatusCode::kInvalidArgument) == 3);
  CHECK(static_cast<int>(absl::StatusCode::kOutOfRange) == 11);
  CHECK(static_cast<int>(absl::StatusCode::kUnavailable) == 14);
  CHECK(static_cast<int>(absl::StatusCode::kDataLoss) == 15);
}

TEST_CASE("RETURN_IF_ERROR returns the error and skips the rest; OK falls through") {
  int reached = 0;
  Status s = FailIf(true, &reached);
  CHECK(s.code() == absl::StatusCode::kDataLoss);
  CHECK(reached == 0);
  CHECK(FailIf(false, &reached).ok());
  CHECK(reached == 1);
}

TEST_CASE("ASSIGN_OR_RETURN unwraps values and propagates the first error") {
  CHECK(*Quarter(8) == 2);
  auto bad = Quarter(6);  // 6 -> 3 -> odd
  REQUIRE_FALSE(bad.ok());
  CHECK(bad.status().code() == absl::StatusCode::kInvalidArgument);
}

TEST_CASE("a StatusError thrown by user code comes back as exactly its Status") {
  Status s = foreman::InvokeUserCode("step function", [] { throw foreman::StatusError(absl::AbortedError("preempted")); });
  CHECK(s.code() == absl::StatusCode::kAborted);
  CHECK(s.message() == "preempted");
}

TEST_CASE("a StatusError carrying OK is still a failure: INTERNAL") {
  Status s = foreman::InvokeUserCode("hook", [] { throw foreman::StatusError(absl::OkStatus()); });
  CHECK(s.code() == absl::StatusCode::kInternal);
  CHECK(Contains(s, "hook"));
}

TEST_CASE("std::invalid_argument and std::domain_error become INVALID_ARGUMENT (TF ValueError)") {
  Status a = foreman::InvokeUserCode("hook", [] { throw std::invalid_argument("bad rate"); });
  CHECK(a.code() == absl::StatusCode::kInvalidArgument);
  CHECK(a.message() == "hook: bad rate");
  Status b = foreman::InvokeUserCode("", [] { throw std::domain_error("log of -1"); });
  CHECK(b.code() == absl::StatusCode::kInvalidArgument);
  CHECK(b.message() == "log of -1");
}

TEST_CASE("any other exception becomes INTERNAL with its message kept") {
  Status s = foreman::InvokeUserCode("listener", [] { throw std::runtime_error("disk on fire"); });
  CHECK(s.code() == absl::StatusCode::kInternal);
  CHECK(Contains(s, "listener"));
  CHECK(Contains(s, "disk on fire"));
  Status odd = foreman::InvokeUserCode("step", [] { throw 42; });
  CHECK(odd.code() == absl::StatusCode::kInternal);
  CHECK(Contains(odd, "unknown exception"));
}

TEST_CASE("std::out_of_range is a bug, not a clean stop: it becomes INTERNAL") {
  Status s = foreman::InvokeUserCode("step", [] { throw std::out_of_range("vector::_M_range_check"); });
  CHECK(s.code() == absl::StatusCode::kInternal);
}

TEST_CASE("std::bad_alloc becomes RESOURCE_EXHAUSTED") {
  Status s = foreman::InvokeUserCode("step", [] { throw std::bad_alloc(); });
  CHECK(s.code() == absl::StatusCode::kResourceExhausted);
}

TEST_CASE("InvokeUserCode passes through returned Status and StatusOr values") {
  CHECK(foreman::InvokeUserCode("x", [] { return absl::OutOfRangeError("end of data"); }).code() ==
        absl::StatusCode::kOutOfRange);
  StatusOr<int> v = foreman::InvokeUserCode("x", [] { return StatusOr<int>(7); });
  CHECK(*v == 7);
  StatusOr<int> e = foreman::InvokeUserCode("x", []() -> StatusOr<int> { throw std::runtime_error("no"); });
  CHECK(e.status().code() == absl::StatusCode::kInternal);
  CHECK(foreman::InvokeUserCode("x", [] {}).ok());
}

TEST_CASE("Annotate prefixes the message and keeps code and payloads") {
  Status nan = foreman::NanLossDuringTrainingError("Model diverged with loss = NaN.");
  Status a = foreman::Annotate(nan, "step 7");
  CHECK(a.code() == absl::StatusCode::kInternal);
  CHECK(a.message() == "step 7: Model diverged with loss = NaN.");
  CHECK(foreman::IsNanLossDuringTraining(a));
  CHECK(foreman::Annotate(absl::OkStatus(), "ctx").ok());
}

TEST_CASE("NanLossDuringTrainingError is INTERNAL with the foreman payload; plain INTERNAL is not") {
  Status nan = foreman::NanLossDuringTrainingError("NaN loss during training.");
  CHECK(nan.code() == absl::StatusCode::kInternal);
  CHECK(foreman::IsNanLossDuringTraining(nan));
  CHECK_FALSE(foreman::IsNanLossDuringTraining(absl::InternalError("NaN loss during training.")));
}
