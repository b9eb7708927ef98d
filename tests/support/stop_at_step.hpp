// StopAtStepHook::Options with one field set (the Options form of the hook),
// for tests that build many StopAtStepHooks.
#pragma once

#include <cstdint>

#include "foreman/hooks.hpp"

namespace foreman::testing {

inline StopAtStepHook::Options LastStep(int64_t last_step) {
  StopAtStepHook::Options o;
  o.last_step = last_step;
  return o;
}

inline StopAtStepHook::Options NumSteps(int64_t num_steps) {
  StopAtStepHook::Options o;
  o.num_steps = num_steps;
  return o;
}

}  // namespace foreman::testing
