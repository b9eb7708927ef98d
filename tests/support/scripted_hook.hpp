// ScriptedHook (a hook whose callbacks log to a CallLog and fail, by status
// or exception, where a script says) and Bounded (run a callable on another
// thread; the test fails instead of hanging), for the adversarial cases of
// issue 4's review in the session, supervisor and actor API tests.
#pragma once

#include <chrono>
#include <functional>
#include <future>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>

#include <doctest/doctest.h>

#include "foreman/hooks.hpp"
#include "foreman/session.hpp"
#include "support/call_log.hpp"

namespace foreman::testing {

// A hook whose callbacks log, and fail (status or exception) where told.
class ScriptedHook : public SessionRunHook {
 public:
  ScriptedHook(std::string name, std::shared_ptr<CallLog> log) : name_(std::move(name)), log_(std::move(log)) {}
  std::string name() const override { return name_; }
  // callback -> what it does on its n-th call (1-based): an error, or throws.
  std::function<Status(const std::string& callback, int n)> script;
  bool throws = false;

  Status Do(const std::string& cb) {
    log_->Add(name_ + "." + cb);
    const int n = ++counts_[cb];
    if (!script) return absl::OkStatus();
    Status s = script(cb, n);
    if (!s.ok() && throws) throw std::runtime_error(std::string(s.message()));
    return s;
  }
  Status begin() override { return Do("begin"); }
  Status after_create_session(Session*, Coordinator* c) override {
    coord = c;
    return Do("after_create_session");
  }
  StatusOr<SessionRunArgs> before_run(SessionRunContext&) override {
    FOREMAN_RETURN_IF_ERROR(Do("before_run"));
    return SessionRunArgs{};
  }
  Status after_run(SessionRunContext&, const SessionRunValues&) override { return Do("after_run"); }
  Status end(Session*) override { return Do("end"); }
  Coordinator* coord = nullptr;

 private:
  std::string name_;
  std::shared_ptr<CallLog> log_;
  std::map<std::string, int> counts_;
};

// Runs `f` on another thread; fails the test (instead of hanging) past 20 s.
template <class F>
auto Bounded(F f) {
  auto fut = std::async(std::launch::async, std::move(f));
  REQUIRE_MESSAGE(fut.wait_for(std::chrono::seconds(20)) == std::future_status::ready, "timed out: hang");
  return fut.get();
}

}  // namespace foreman::testing
