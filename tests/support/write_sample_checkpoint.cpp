// Writes a known checkpoint for tests/inspect_cli_test.sh: two saves of the
// store below into DIR, at steps 41 and 42 (global_step holds the step).
// Usage: write_sample_checkpoint DIR [--hostile]; prints the latest prefix.
// With --hostile, also the bundle DIR/hostile (printed instead) with one
// tensor whose name holds a newline, an escape sequence and a byte that is
// not UTF-8: "evil\n\x1b[2Jname\xff".
//
//   dense/bias     float64 [3]    {0.5, -1.5, 2}
//   dense/kernel   float32 [2,3]  {1, 2, 3, 4, 5, 6}
//   embedding/ids  int32   [12]   {0, 1, ..., 11}
//   global_step    int64   []     step
//   mask           uint8   [4]    {0, 1, 254, 255}
//   vocab          string  [3]    {"a", "", "x" * 200}
#include <cstdio>
#include <numeric>
#include <string>
#include <vector>

#include "foreman/bundle.hpp"
#include "foreman/checkpoint.hpp"

namespace {

foreman::Status WriteSample(const std::string& dir, bool hostile, std::string* latest) {
  using foreman::Tensor;
  foreman::VariableStore vars;
  std::vector<int32_t> ids(12);
  std::iota(ids.begin(), ids.end(), 0);
  FOREMAN_RETURN_IF_ERROR(vars.Create("dense/bias", *Tensor::FromVector<double>({0.5, -1.5, 2}, {3})));
  FOREMAN_RETURN_IF_ERROR(vars.Create("dense/kernel", *Tensor::FromVector<float>({1, 2, 3, 4, 5, 6}, {2, 3})));
  FOREMAN_RETURN_IF_ERROR(vars.Create("embedding/ids", *Tensor::FromVector<int32_t>(ids, {12})));
  FOREMAN_RETURN_IF_ERROR(vars.Create("mask", *Tensor::FromVector<uint8_t>({0, 1, 254, 255}, {4})));
  FOREMAN_RETURN_IF_ERROR(
      vars.Create("vocab", *Tensor::FromVector<std::string>({"a", "", std::string(200, 'x')}, {3})));
  FOREMAN_RETURN_IF_ERROR(foreman::CreateGlobalStep(vars));

  FOREMAN_RETURN_IF_ERROR(foreman::Env::Default()->RecursivelyCreateDir(dir));
  FOREMAN_ASSIGN_OR_RETURN(auto saver, foreman::Saver::Create({}));
  for (int64_t step : {41, 42}) {
    FOREMAN_RETURN_IF_ERROR(foreman::SetGlobalStep(vars, step));
    FOREMAN_ASSIGN_OR_RETURN(*latest, saver->Save(vars, foreman::JoinPath(dir, "model.ckpt"), step));
  }
  if (hostile) {  // a name no VariableStore takes, as another writer could store it
    *latest = foreman::JoinPath(dir, "hostile");
    FOREMAN_ASSIGN_OR_RETURN(auto writer, foreman::BundleWriter::Create(foreman::Env::Default(), *latest));
    FOREMAN_RETURN_IF_ERROR(writer->Add("evil\n\x1b[2Jname\xff", Tensor::Scalar<float>(1.0f)));
    FOREMAN_RETURN_IF_ERROR(writer->Finish());
  }
  return absl::OkStatus();
}

}  // namespace

int main(int argc, char** argv) {
  const bool hostile = argc == 3 && std::string(argv[2]) == "--hostile";
  if (argc != 2 && !hostile) {
    std::fprintf(stderr, "usage: %s DIR [--hostile]\n", argv[0]);
    return 2;
  }
  std::string latest;
  foreman::Status s = WriteSample(argv[1], hostile, &latest);
  if (!s.ok()) {
    std::fprintf(stderr, "write_sample_checkpoint: %s\n", s.ToString().c_str());
    return 1;
  }
  std::printf("%s\n", latest.c_str());
  return 0;
}
