// A small training graph and the helpers the MonitoredTrainingSession tests
// share: Model / MakeGraph (global_step, "w" +1 per train_op, one summary
// op), Int, Checkpoints, QuietOptions, Open.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <doctest/doctest.h>

#include "foreman/checkpoint.hpp"
#include "foreman/clock.hpp"
#include "foreman/graph.hpp"
#include "foreman/hooks.hpp"
#include "foreman/monitored_session.hpp"
#include "foreman/summary.hpp"
#include "foreman/variable_store.hpp"

namespace foreman::testing {

// What the step does, and how often the model was initialized.
struct Model {
  std::function<Status(int64_t step)> on_train;  // before a train_op update; non-OK fails the step
  std::atomic<int> w_initialized{0};             // calls of w's initializer (the init op ran)
  std::atomic<int> train_calls{0};
};

// global_step, "w" (+1 per train_op), and one summary op "summaries" (TF:
// a graph with one scalar summary).
inline std::shared_ptr<Graph> MakeGraph(const std::shared_ptr<Model>& model, bool global_step = true) {
  auto graph = std::make_shared<Graph>();
  if (global_step) REQUIRE(graph->CreateGlobalStep().ok());
  REQUIRE(graph
              ->AddVariable("w",
                            [model]() -> StatusOr<Tensor> {
                              ++model->w_initialized;
                              return Tensor::Scalar<float>(0.f);
                            })
              .ok());
  REQUIRE(graph->AddSummaryOp("summaries").ok());
  REQUIRE(graph
              ->SetStep([model](StepContext& ctx) -> Status {
                if (ctx.requested("train_op")) {
                  FOREMAN_ASSIGN_OR_RETURN(int64_t step, GetGlobalStep(ctx.variables()));
                  ++model->train_calls;
                  if (model->on_train) FOREMAN_RETURN_IF_ERROR(model->on_train(step));
                  FOREMAN_ASSIGN_OR_RETURN(Tensor * w, ctx.variables().Get("w"));
                  FOREMAN_ASSIGN_OR_RETURN(float wv, w->scalar<float>());
                  *w = Tensor::Scalar<float>(wv + 1.f);
                  FOREMAN_ASSIGN_OR_RETURN(int64_t next, IncrementGlobalStep(ctx.variables()));
                  ctx.Set("train_op", Tensor::Scalar<int64_t>(next));
                }
                if (ctx.requested("summaries")) {
                  ctx.Set("summaries", Tensor::Scalar<std::string>(ScalarSummary("loss", 0.5f)));
                }
                return absl::OkStatus();
              })
              .ok());
  return graph;
}

inline int64_t Int(const Tensor& t) { return t.scalar<int64_t>().value(); }

// The base names of the checkpoints in `dir`, oldest first.
inline std::vector<std::string> Checkpoints(const std::string& dir, Env* env = Env::Default()) {
  auto prefixes = ListCheckpointPrefixes(env, dir);
  REQUIRE_MESSAGE(prefixes.ok(), prefixes.status().ToString());
  std::vector<std::string> out;
  for (const auto& p : *prefixes) out.push_back(p.substr(p.find_last_of('/') + 1));
  return out;
}

// Options with every periodic service off (no saver, summaries or step
// counter), no grace period, time from `clock`, and `hooks` followed by a
// StopAtStepHook(last_step); tests turn on what they check.
inline MonitoredTrainingSessionOptions QuietOptions(const std::string& dir, Clock* clock, HookList hooks,
                                                    int64_t last_step) {
  MonitoredTrainingSessionOptions o;
  o.graph = MakeGraph(std::make_shared<Model>());
  o.checkpoint_dir = dir;
  o.config.clock = clock;
  o.stop_grace_period_secs = 0;
  o.save_checkpoint_secs = std::nullopt;
  o.save_checkpoint_steps = std::nullopt;
  o.save_summaries_steps = std::nullopt;
  o.save_summaries_secs = std::nullopt;
  o.log_step_count_steps = std::nullopt;
  auto stop = StopAtStepHook::Create({std::nullopt, last_step});
  REQUIRE(stop.ok());
  hooks.push_back(*stop);
  o.hooks = std::move(hooks);
  return o;
}

inline std::unique_ptr<MonitoredSession> Open(MonitoredTrainingSessionOptions o) {
  auto sess = MonitoredTrainingSession(std::move(o));
  REQUIRE_MESSAGE(sess.ok(), sess.status().ToString());
  return std::move(sess).value();
}

}  // namespace foreman::testing
