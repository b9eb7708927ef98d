// Built by install_test.sh against the *installed* headers and foreman.pc:
// proves the public headers are self-contained and the library links.
#include <cstdio>

#include "foreman/crc32c.hpp"
#include "foreman/status.hpp"
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
  std::printf("hello from foreman %s: global_step=%lld crc=%08x\n", FOREMAN_VERSION,
              static_cast<long long>(*step + 1), foreman::crc32c::Value("123456789", 9));
  return 0;
}
