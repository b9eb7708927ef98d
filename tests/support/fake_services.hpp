// FakeServices: an internal::Services (runtime/services.hpp) without actors,
// for tests that hand a hook its services directly (AttachServices): no
// service can be created (UNIMPLEMENTED), no error, no pending save, no
// service faults. A test derives from it and overrides what it needs.
#pragma once

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "foreman/clock.hpp"
#include "foreman/env.hpp"
#include "runtime/services.hpp"

namespace foreman::testing {

class FakeServices : public internal::Services {
 public:
  /// `env` and `clock` (not owned) are what env() and clock() return.
  FakeServices(Env* env, Clock* clock) : env_(env), clock_(clock) {}

  StatusOr<std::shared_ptr<internal::SummaryWriterService>> SummaryWriter(const std::string&) override {
    return absl::UnimplementedError("FakeServices: no summary writer");
  }
  StatusOr<std::shared_ptr<internal::CheckpointService>> CheckpointSaver(const std::string&, std::shared_ptr<Saver>,
                                                                         const std::string&) override {
    return absl::UnimplementedError("FakeServices: no checkpoint saver");
  }
  StatusOr<std::shared_ptr<internal::StepCounterService>> StepCounter(const std::string&,
                                                                      const std::string&) override {
    return absl::UnimplementedError("FakeServices: no step counter");
  }
  void SetCoordinator(Coordinator*) override {}
  Status error() override { return absl::OkStatus(); }
  Status WaitForPendingSaves(absl::Duration) override { return absl::OkStatus(); }
  void ObserveSaves(internal::SaveObservers::Fn) override {}
  Clock* clock() override { return clock_; }
  Env* env() override { return env_; }

 private:
  Env* env_;
  Clock* clock_;
};

}  // namespace foreman::testing
