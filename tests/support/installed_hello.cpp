// Built by install_test.sh against the *installed* headers and foreman.pc
// alone: proves the public headers are self-contained and their symbols are
// exported, including the model and data headers (nn.hpp, dataset.hpp,
// input_pipeline.hpp) users train with.
#include <cstdio>

#include "foreman/crc32c.hpp"
#include "foreman/dataset.hpp"
#include "foreman/input_pipeline.hpp"
#include "foreman/monitored_session.hpp"
#include "foreman/nn.hpp"
#include "foreman/status.hpp"
#include "foreman/supervisor.hpp"
#include "foreman/tensor.hpp"
#include "foreman/variable_store.hpp"
#include "foreman/version.hpp"

int main() {
  foreman::VariableStore vars;
  if (!foreman::CreateGlobalStep(vars).ok()) return 1;
  auto step = foreman::IncrementGlobalStep(vars, 41);
  if (!step.ok()) return 1;
  auto m = foreman::Tensor(foreman::DataType::kFloat, {2, 2}).matrix<float>();
  if (!m.ok()) return 1;

  // nn.hpp: an MLP's variables in a graph.
  foreman::nn::MlpSpec spec;
  spec.input_dim = 4;
  spec.hidden = {3};
  spec.num_classes = 2;
  foreman::Graph graph;
  if (!foreman::nn::AddMlpVariables(graph, spec, foreman::nn::OptimizerOptions(), /*seed=*/1).ok()) return 1;

  // dataset.hpp + input_pipeline.hpp: one batch through the producer actor.
  foreman::data::LabeledImages data{foreman::Tensor(foreman::DataType::kUInt8, {3, 2, 2}),
                              foreman::Tensor(foreman::DataType::kUInt8, {3})};
  foreman::data::DatasetOptions options;
  options.batch_size = 2;
  auto dataset = foreman::data::Dataset::Create(std::move(data), options);
  if (!dataset.ok()) return 1;
  auto pipeline = foreman::data::InputPipeline::Create(*dataset, foreman::data::InputPipelineOptions());
  if (!pipeline.ok()) return 1;
  auto batch = (*pipeline)->Next(foreman::data::DatasetPosition(), absl::Seconds(30));
  if (!batch.ok()) {
    std::printf("input pipeline: %s\n", batch.status().ToString().c_str());
    return 1;
  }

  std::printf("hello from foreman %s: global_step=%lld crc=%08x variables=%zu\n", FOREMAN_VERSION,
              static_cast<long long>(*step + 1), foreman::crc32c::Value("123456789", 9), graph.variables().size());
  return 0;
}
