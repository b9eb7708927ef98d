// The model train_bench and recovery_bench run: `foreman train`'s MLP
// 784-256-10 with Adam (TF1's defaults), batch 128 of shuffled Fashion-MNIST,
// as a Graph whose step answers "train_op" (one batch: forward, backward,
// update, global_step += 1) and "loss". Batches come synchronously from
// Dataset::GetBatch on the training thread, as PyTorch's loop gathers them;
// the position lives in the step's closure (the benchmarks do not resume).
#pragma once

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <string>

#include "foreman/dataset.hpp"
#include "foreman/graph.hpp"
#include "foreman/nn.hpp"
#include "foreman/session.hpp"
#include "foreman/variable_store.hpp"

namespace foreman_bench {

struct MlpModel {
  foreman::nn::MlpSpec spec{784, {256}, 10};
  foreman::nn::OptimizerOptions optimizer;  // Adam, lr 1e-3, TF1's betas and epsilon
  std::shared_ptr<const foreman::data::Dataset> train;
  std::unique_ptr<foreman::nn::Mlp> mlp;
  foreman::data::DatasetPosition position;
  int64_t samples = 0;  // rows trained on so far
  /// Called before each training step; a non-OK status is the step's result
  /// (recovery_bench injects ABORTED with it).
  std::function<foreman::Status(int64_t global_step)> before_step;
};

[[noreturn]] inline void DieOn(const std::string& what, const foreman::Status& s) {
  std::fprintf(stderr, "%s: %s\n", what.c_str(), s.ToString().c_str());
  std::exit(1);
}

/// Loads the training set (batch 128, shuffled, repeated forever) and builds
/// the model. Exits on error.
inline std::shared_ptr<MlpModel> LoadMlpModel(const std::string& data_dir, uint64_t seed) {
  auto model = std::make_shared<MlpModel>();
  auto mnist = foreman::data::LoadFashionMnist(foreman::Env::Default(), data_dir);
  if (!mnist.ok()) DieOn("loading Fashion-MNIST from " + data_dir, mnist.status());
  foreman::data::DatasetOptions options;
  options.batch_size = 128;
  options.epochs = 0;
  options.shuffle = true;
  options.seed = seed;
  auto train = foreman::data::Dataset::Create(std::move(mnist->train), options);
  if (!train.ok()) DieOn("dataset", train.status());
  model->train = *train;
  model->spec.input_dim = model->train->feature_dim();
  auto mlp = foreman::nn::Mlp::Create(model->spec, model->optimizer);
  if (!mlp.ok()) DieOn("model", mlp.status());
  model->mlp = std::move(*mlp);
  return model;
}

/// A graph with global_step, the MLP's variables (glorot_uniform kernels,
/// zero biases, Adam slots) and the training step.
inline std::shared_ptr<foreman::Graph> MlpGraph(const std::shared_ptr<MlpModel>& model, uint64_t seed) {
  auto graph = std::make_shared<foreman::Graph>();
  foreman::Status s = graph->CreateGlobalStep();
  if (s.ok()) s = foreman::nn::AddMlpVariables(*graph, model->spec, model->optimizer, seed);
  if (s.ok()) {
    s = graph->SetStep([model](foreman::StepContext& ctx) -> foreman::Status {
      if (!ctx.requested("train_op") && !ctx.requested("loss")) return absl::OkStatus();
      foreman::VariableStore& vars = ctx.variables();
      if (model->before_step) {
        FOREMAN_ASSIGN_OR_RETURN(int64_t step, foreman::GetGlobalStep(vars));
        FOREMAN_RETURN_IF_ERROR(model->before_step(step));
      }
      FOREMAN_ASSIGN_OR_RETURN(foreman::data::Batch batch, model->train->GetBatch(model->position));
      FOREMAN_ASSIGN_OR_RETURN(foreman::nn::StepResult r,
                               model->mlp->TrainStep(vars, batch.features, batch.labels, ctx.compute()));
      model->position = batch.next;
      model->samples += batch.labels.num_elements();
      FOREMAN_RETURN_IF_ERROR(foreman::IncrementGlobalStep(vars).status());
      ctx.Set("train_op", foreman::Tensor::Scalar<int64_t>(1));
      ctx.Set("loss", foreman::Tensor::Scalar<float>(r.loss));
      return absl::OkStatus();
    });
  }
  if (!s.ok()) DieOn("building the graph", s);
  return graph;
}

}  // namespace foreman_bench
