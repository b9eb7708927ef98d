// RecordingHook: a hook that logs every callback to a CallLog and records
// what it saw (sessions, coordinators, contexts, results, options); each
// callback's result can be replaced. Shared by the session tests.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "foreman/hooks.hpp"
#include "foreman/session.hpp"
#include "support/call_log.hpp"

namespace foreman::testing {

// Logs "<name>.<callback>" and records what it saw; each callback's result
// can be replaced.
class RecordingHook : public SessionRunHook, public internal::ServiceUser {
 public:
  RecordingHook(std::string name, std::shared_ptr<CallLog> log) : name_(std::move(name)), log_(std::move(log)) {}
  std::string name() const override { return name_; }

  void AttachServices(internal::Services* services) override { this->services = services; }
  Status begin() override {
    log_->Add(name_ + ".begin");
    return on_begin ? on_begin() : absl::OkStatus();
  }
  Status after_create_session(Session* session, Coordinator* coord) override {
    log_->Add(name_ + ".after_create_session");
    sessions.push_back(session);
    coords.push_back(coord);
    return on_create ? on_create(session, coord) : absl::OkStatus();
  }
  StatusOr<SessionRunArgs> before_run(SessionRunContext& ctx) override {
    log_->Add(name_ + ".before_run");
    before_contexts.push_back(&ctx);
    if (on_before) return on_before(ctx);
    return args;
  }
  Status after_run(SessionRunContext& ctx, const SessionRunValues& values) override {
    log_->Add(name_ + ".after_run");
    after_contexts.push_back(&ctx);
    results.push_back(values.results != nullptr ? std::optional<TensorMap>(*values.results) : std::nullopt);
    options.push_back(*values.options);
    metadata.push_back(values.run_metadata);
    if (request_stop_in_after_run) ctx.request_stop();
    return on_after ? on_after(ctx, values) : absl::OkStatus();
  }
  Status end(Session* session) override {
    log_->Add(name_ + ".end");
    end_sessions.push_back(session);
    return on_end ? on_end(session) : absl::OkStatus();
  }

  SessionRunArgs args;  // what before_run returns unless on_before is set
  bool request_stop_in_after_run = false;
  std::function<Status()> on_begin;
  std::function<Status(Session*, Coordinator*)> on_create;
  std::function<StatusOr<SessionRunArgs>(SessionRunContext&)> on_before;
  std::function<Status(SessionRunContext&, const SessionRunValues&)> on_after;
  std::function<Status(Session*)> on_end;

  internal::Services* services = nullptr;
  std::vector<Session*> sessions;
  std::vector<Coordinator*> coords;
  std::vector<SessionRunContext*> before_contexts;
  std::vector<SessionRunContext*> after_contexts;
  std::vector<std::optional<TensorMap>> results;
  std::vector<RunOptions> options;
  std::vector<const RunMetadata*> metadata;
  std::vector<Session*> end_sessions;

 private:
  std::string name_;
  std::shared_ptr<CallLog> log_;
};

}  // namespace foreman::testing
