#include "foreman/status.hpp"

#include <new>
#include <stdexcept>

#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"
#include "fault/injected_fault.hpp"

namespace foreman {

namespace {

std::string Prefixed(const std::string& where, const std::string& message) {
  return where.empty() ? message : absl::StrCat(where, ": ", message);
}

}  // namespace

Status StatusFromException(std::exception_ptr ep, const std::string& where) {
  try {
    std::rethrow_exception(ep);
  } catch (const StatusError& e) {
    // An exception means failure: one carrying OK is a bug in user code.
    if (e.status().ok()) return absl::InternalError(Prefixed(where, "StatusError thrown with an OK status"));
    return e.status();
  } catch (const std::invalid_argument& e) {
    return absl::InvalidArgumentError(Prefixed(where, e.what()));
  } catch (const std::domain_error& e) {
    return absl::InvalidArgumentError(Prefixed(where, e.what()));
  } catch (const std::bad_alloc& e) {
    return absl::ResourceExhaustedError(Prefixed(where, absl::StrCat("out of memory (", e.what(), ")")));
  } catch (const std::exception& e) {
    return absl::InternalError(Prefixed(where, e.what()));
  } catch (...) {
    return absl::InternalError(Prefixed(where, "unknown exception (not derived from std::exception)"));
  }
}

Status WithPayloadsOf(Status s, const Status& from) {
  if (s.ok()) return s;
  from.ForEachPayload([&s](absl::string_view url, const absl::Cord& payload) { s.SetPayload(url, payload); });
  return s;
}

Status Annotate(const Status& s, const std::string& context) {
  if (s.ok() || context.empty()) return s;
  return WithPayloadsOf(Status(s.code(), absl::StrCat(context, ": ", s.message())), s);
}

Status NanLossDuringTrainingError(const std::string& message) {
  Status s = absl::InternalError(message);
  s.SetPayload(kNanLossPayload, absl::Cord("NanLossDuringTrainingError"));
  return s;
}

bool IsNanLossDuringTraining(const Status& s) {
  return s.GetPayload(kNanLossPayload).has_value();
}

}  // namespace foreman
