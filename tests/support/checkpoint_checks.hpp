// Checks shared by the crash, fault and device tests: a checkpoint verifies
// and restores to the values a run saved at a given step; a checkpoint's
// tensors read back by name.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <utility>

#include <doctest/doctest.h>

#include "foreman/bundle.hpp"
#include "foreman/checkpoint.hpp"
#include "foreman/env.hpp"
#include "foreman/variable_store.hpp"

namespace foreman::testing {

// `prefix` verifies (every tensor's CRC32C), restores into a fresh store that
// `create` builds, and then holds exactly what `fill` puts there for `step`
// (every variable compared).
inline void CheckRestores(Env* env, const std::string& prefix, int64_t step,
                          const std::function<void(VariableStore*)>& create,
                          const std::function<void(VariableStore*, int64_t)>& fill) {
  CAPTURE(prefix);
  auto reader = BundleReader::Open(env, prefix);
  REQUIRE_MESSAGE(reader.ok(), reader.status().ToString());
  Status verified = (*reader)->VerifyAll();
  REQUIRE_MESSAGE(verified.ok(), verified.ToString());
  SaverOptions o;
  o.env = env;
  auto saver = Saver::Create(o);
  REQUIRE_MESSAGE(saver.ok(), saver.status().ToString());
  VariableStore vars;
  create(&vars);
  Status restored = (*saver)->Restore(prefix, &vars);
  REQUIRE_MESSAGE(restored.ok(), restored.ToString());
  VariableStore expected;
  create(&expected);
  fill(&expected, step);
  for (const std::string& name : expected.Names()) {
    CAPTURE(name);
    CHECK((*vars.Get(name))->Equals(**expected.Get(name)));
  }
}

// Every tensor of the checkpoint at `prefix` (Env::Default()), by name.
inline std::map<std::string, Tensor> ReadCheckpoint(const std::string& prefix) {
  auto reader = BundleReader::Open(Env::Default(), prefix);
  REQUIRE_MESSAGE(reader.ok(), reader.status().ToString());
  std::map<std::string, Tensor> out;
  for (const BundleEntry& e : (*reader)->entries()) {
    auto t = (*reader)->Lookup(e.name);
    REQUIRE_MESSAGE(t.ok(), t.status().ToString());
    out.emplace(e.name, *std::move(t));
  }
  return out;
}

}  // namespace foreman::testing
