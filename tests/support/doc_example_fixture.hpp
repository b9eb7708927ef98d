// What the headers' and docs' examples (tests/doc_examples.py) find in scope:
// small, real values for the names an example uses without declaring them.
// An example may shadow any of them.
#pragma once

#include <caf/all.hpp>

#include <condition_variable>
#include <cstdio>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "foreman/actor_api.hpp"
#include "foreman/dataset.hpp"
#include "foreman/env.hpp"
#include "foreman/graph.hpp"
#include "foreman/hooks.hpp"
#include "foreman/session.hpp"
#include "foreman/status.hpp"
#include "foreman/tensor.hpp"
#include "foreman/variable_store.hpp"

namespace foreman_doc {

struct Fixture {};

using ExampleFn = foreman::Status (*)(Fixture&);
struct Example {
  const char* where;  // "include/foreman/graph.hpp:11"
  ExampleFn run;
};
/// Every example, in file order (generated).
const std::vector<Example>& Examples();

/// A graph with "global_step" and "w" (float32 scalar, 5): the step answers
/// "loss" (w²) and "summaries" (a Summary with the loss), and on "train_op"
/// takes a gradient step and increments global_step. Not finalized.
std::shared_ptr<foreman::Graph> ExampleGraph();
/// Puts global_step = 100 and "dense/kernel" into `vars`.
void FillExampleVariables(foreman::VariableStore& vars);
/// A float32 [2, 3] tensor.
foreman::Tensor ExampleKernel();
/// Writes an event file with a few scalars under "example_events/"; its path.
std::string ExampleEventFile();
/// 10 images of 2x2 pixels in batches of 4, 2 epochs.
std::shared_ptr<const foreman::data::Dataset> ExampleDataset();
/// Fashion-MNIST's layout in small: 100 training and 20 test images of 4x4,
/// labels 0..9.
foreman::data::FashionMnist ExampleImages();
/// StopAtStepHook at last_step 200.
std::shared_ptr<foreman::SessionRunHook> ExampleStopAtStepHook();
/// A job training ExampleGraph to step 50 in "job_dir".
foreman::TrainingJob ExampleJob();
/// `n` free ports on 127.0.0.1 as a "127.0.0.1:P,127.0.0.1:Q" host list.
std::string FreeLoopbackHosts(int n);

}  // namespace foreman_doc

// The names every example can use.
#define FOREMAN_DOC_EXAMPLE_NAMES(fx)                                                              \
  (void)fx;                                                                                        \
  [[maybe_unused]] foreman::Env* env = foreman::Env::Default();                                    \
  [[maybe_unused]] std::shared_ptr<foreman::Graph> graph = foreman_doc::ExampleGraph();            \
  [[maybe_unused]] foreman::SessionConfig config;                                                  \
  [[maybe_unused]] foreman::TensorMap feeds;                                                       \
  [[maybe_unused]] foreman::VariableStore vars;                                                    \
  foreman_doc::FillExampleVariables(vars);                                                         \
  [[maybe_unused]] int64_t step = 100;                                                             \
  [[maybe_unused]] foreman::Tensor kernel = foreman_doc::ExampleKernel();                          \
  [[maybe_unused]] std::string text = "model_checkpoint_path: \"model.ckpt-100\"\n";               \
  [[maybe_unused]] std::string path = foreman_doc::ExampleEventFile();                             \
  [[maybe_unused]] std::shared_ptr<const foreman::data::Dataset> dataset = foreman_doc::ExampleDataset(); \
  [[maybe_unused]] foreman::data::DatasetPosition restored_position;                                     \
  [[maybe_unused]] std::shared_ptr<foreman::SessionRunHook> stop_at_step_hook =                    \
      foreman_doc::ExampleStopAtStepHook();

// And those of actor_api.hpp's examples: an actor system configured as
// Foreman asks, a scoped actor, a job and a Status to fill.
#define FOREMAN_DOC_ACTOR_NAMES(fx)                                                 \
  caf::actor_system_config actor_config;                                            \
  foreman::ConfigureActorSystem(actor_config);                                      \
  [[maybe_unused]] caf::actor_system system{actor_config};                          \
  [[maybe_unused]] caf::scoped_actor self{system};                                  \
  [[maybe_unused]] foreman::TrainingJob job_spec = foreman_doc::ExampleJob();       \
  [[maybe_unused]] foreman::Status status;

// And those of server.hpp's examples: TF1's --ps_hosts and --worker_hosts,
// on free loopback ports (a cluster's processes get them as flags).
#define FOREMAN_DOC_SERVER_NAMES(fx)                                             \
  [[maybe_unused]] std::string ps_hosts = foreman_doc::FreeLoopbackHosts(1);     \
  [[maybe_unused]] std::string worker_hosts = foreman_doc::FreeLoopbackHosts(1);
