// The model both examples train: linear regression y = 3x + 2 on a fixed,
// seeded data set, by full-batch gradient descent. Small on purpose: the
// examples are about the runtime around it.
//
// Fetches the step answers: "train_op" (one SGD update, global_step += 1),
// "loss" (float32 scalar, mean squared error before the update), "w", "b",
// and "summaries" (a serialized Summary with the loss).
#pragma once

#include <cmath>
#include <memory>
#include <random>
#include <vector>

#include "foreman/graph.hpp"
#include "foreman/session.hpp"
#include "foreman/summary.hpp"
#include "foreman/variable_store.hpp"

namespace foreman_examples {

inline std::shared_ptr<foreman::Graph> LinearModel(float learning_rate = 0.1f) {
  std::mt19937 rng(42);
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  auto xs = std::make_shared<std::vector<float>>(256);
  auto ys = std::make_shared<std::vector<float>>(256);
  for (size_t i = 0; i < xs->size(); ++i) {
    (*xs)[i] = uniform(rng);
    (*ys)[i] = 3.0f * (*xs)[i] + 2.0f + 0.01f * uniform(rng);
  }
  auto graph = std::make_shared<foreman::Graph>();
  (void)graph->CreateGlobalStep();
  (void)graph->AddVariable("linear/w", foreman::Tensor::Scalar<float>(0.0f));
  (void)graph->AddVariable("linear/b", foreman::Tensor::Scalar<float>(0.0f));
  (void)graph->AddSummaryOp("summaries");
  (void)graph->SetStep([xs, ys, learning_rate](foreman::StepContext& ctx) -> foreman::Status {
    FOREMAN_ASSIGN_OR_RETURN(foreman::Tensor * w_t, ctx.variables().Get("linear/w"));
    FOREMAN_ASSIGN_OR_RETURN(foreman::Tensor * b_t, ctx.variables().Get("linear/b"));
    float& w = w_t->data<float>()[0];
    float& b = b_t->data<float>()[0];
    double loss = 0, dw = 0, db = 0;
    for (size_t i = 0; i < xs->size(); ++i) {
      const double err = w * (*xs)[i] + b - (*ys)[i];
      loss += err * err;
      dw += 2 * err * (*xs)[i];
      db += 2 * err;
    }
    const double n = static_cast<double>(xs->size());
    loss /= n;
    ctx.Set("loss", foreman::Tensor::Scalar<float>(static_cast<float>(loss)));
    ctx.Set("summaries", foreman::Tensor::Scalar<std::string>(
                             foreman::ScalarSummary("loss", static_cast<float>(loss))));
    if (ctx.requested("train_op")) {
      w -= learning_rate * static_cast<float>(dw / n);
      b -= learning_rate * static_cast<float>(db / n);
      FOREMAN_RETURN_IF_ERROR(foreman::IncrementGlobalStep(ctx.variables()).status());
      ctx.Set("train_op", foreman::Tensor::Scalar<int64_t>(1));
    }
    ctx.Set("w", *w_t);
    ctx.Set("b", *b_t);
    return foreman::Status();
  });
  return graph;
}

}  // namespace foreman_examples
