#include "foreman/graph.hpp"

#include <algorithm>
#include <utility>

#include "foreman/variable_store.hpp"

namespace foreman {
namespace {

Status FinalizedError() {
  // TF's message when an op is added to a finalized graph (B21).
  return absl::FailedPreconditionError("Graph is finalized and cannot be modified.");
}

}  // namespace

Status Graph::AddVariable(const std::string& name, Tensor initial_value, bool trainable) {
  if (initial_value.dtype() == DataType::kInvalid) {
    return absl::InvalidArgumentError("variable '" + name + "': initial value has no dtype");
  }
  auto value = std::make_shared<const Tensor>(std::move(initial_value));
  return AddVariable(name, Initializer([value]() -> StatusOr<Tensor> { return *value; }), trainable);
}

Status Graph::AddVariable(const std::string& name, Initializer initializer, bool trainable) {
  if (finalized()) return FinalizedError();
  FOREMAN_RETURN_IF_ERROR(VariableStore::ValidateName(name));
  if (!initializer) return absl::InvalidArgumentError("variable '" + name + "': no initializer");
  for (const VariableDef& def : variables_) {
    if (def.name == name) return absl::AlreadyExistsError("variable '" + name + "' is already declared");
  }
  variables_.push_back(VariableDef{name, std::move(initializer), trainable, /*local=*/false, /*device=*/""});
  return absl::OkStatus();
}

Status Graph::AddLocalVariable(const std::string& name, Tensor initial_value) {
  FOREMAN_RETURN_IF_ERROR(AddVariable(name, std::move(initial_value), /*trainable=*/false));
  variables_.back().local = true;
  return absl::OkStatus();
}

Status Graph::SetVariableDevice(const std::string& name, const std::string& device) {
  if (finalized()) return FinalizedError();
  if (!device.empty() && device != "/job:worker") {
    return absl::InvalidArgumentError("variable '" + name + "': device '" + device +
                                      "' is not supported: use \"\" (a ps task, the default) or \"/job:worker\"");
  }
  for (VariableDef& def : variables_) {
    if (def.name == name) {
      def.device = device;
      return absl::OkStatus();
    }
  }
  return absl::NotFoundError("Graph::SetVariableDevice: variable '" + name + "' is not declared");
}

Status Graph::CreateGlobalStep() {
  if (finalized()) return FinalizedError();
  if (has_global_step()) return absl::AlreadyExistsError("global_step already exists.");
  return AddVariable(kGlobalStepName, Tensor::Scalar<int64_t>(0), /*trainable=*/false);
}

bool Graph::has_global_step() const {
  return std::any_of(variables_.begin(), variables_.end(),
                     [](const VariableDef& def) { return def.name == kGlobalStepName && !def.local; });
}

Status Graph::SetStep(StepFn step) {
  if (finalized()) return FinalizedError();
  step_ = std::move(step);
  return absl::OkStatus();
}

Status Graph::AddSummaryOp(const std::string& fetch) {
  if (finalized()) return FinalizedError();
  if (fetch.empty()) return absl::InvalidArgumentError("summary op: empty fetch name");
  if (std::find(summary_ops_.begin(), summary_ops_.end(), fetch) == summary_ops_.end()) {
    summary_ops_.push_back(fetch);
  }
  return absl::OkStatus();
}

Status Graph::AddFetch(const std::string& fetch) {
  if (finalized()) return FinalizedError();
  if (fetch.empty()) return absl::InvalidArgumentError("Graph::AddFetch: empty fetch name");
  if (std::find(fetches_.begin(), fetches_.end(), fetch) == fetches_.end()) fetches_.push_back(fetch);
  return absl::OkStatus();
}

std::vector<std::string> Graph::GlobalVariableNames() const {
  std::vector<std::string> names;
  for (const VariableDef& def : variables_) {
    if (!def.local) names.push_back(def.name);
  }
  std::sort(names.begin(), names.end());
  return names;
}

std::vector<std::string> Graph::LocalVariableNames() const {
  std::vector<std::string> names;
  for (const VariableDef& def : variables_) {
    if (def.local) names.push_back(def.name);
  }
  std::sort(names.begin(), names.end());
  return names;
}

void Graph::Finalize() { finalized_.store(true, std::memory_order_release); }
bool Graph::finalized() const { return finalized_.load(std::memory_order_acquire); }
void Graph::Unfinalize() { finalized_.store(false, std::memory_order_release); }

}  // namespace foreman
