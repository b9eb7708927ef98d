// Writes the fuzzers' seed corpus: valid event files and valid checkpoints
// (in checkpoint_fuzzer's layout), from Foreman's writers and from the real
// TensorFlow checkpoints in tests/testdata.
// Usage: make_corpus OUT_DIR TESTDATA_DIR  (creates OUT_DIR/record, OUT_DIR/checkpoint)
#include <cstdio>
#include <string>

#include "foreman/bundle.hpp"
#include "foreman/event_writer.hpp"
#include "foreman/mem_env.hpp"
#include "foreman/summary.hpp"

namespace {

using foreman::Env;
using foreman::Status;

Status WriteCheckpointSeed(Env* out, const std::string& path, const std::string& index, const std::string& data) {
  if (index.size() > 0xFFFF) return absl::InvalidArgumentError("index too large for the seed layout");
  std::string seed;
  seed.push_back(static_cast<char>(index.size() & 0xFF));
  seed.push_back(static_cast<char>(index.size() >> 8));
  seed += index;
  seed += data;
  return foreman::WriteStringToFile(out, path, seed);
}

Status SeedFromPrefix(Env* src, const std::string& prefix, Env* out, const std::string& path) {
  FOREMAN_ASSIGN_OR_RETURN(std::string index, src->ReadFileToString(foreman::BundleIndexPath(prefix)));
  FOREMAN_ASSIGN_OR_RETURN(std::string data, src->ReadFileToString(foreman::BundleDataPath(prefix)));
  return WriteCheckpointSeed(out, path, index, data);
}

Status Run(const std::string& out_dir, const std::string& testdata) {
  Env* out = Env::Default();
  FOREMAN_RETURN_IF_ERROR(out->RecursivelyCreateDir(out_dir + "/record"));
  FOREMAN_RETURN_IF_ERROR(out->RecursivelyCreateDir(out_dir + "/checkpoint"));
  foreman::MemEnv mem;

  // Event file with every kind of value.
  foreman::EventFileWriterOptions options;
  options.env = &mem;
  options.hostname = "fuzz";
  FOREMAN_ASSIGN_OR_RETURN(auto writer, foreman::EventFileWriter::Create("/logs", options));
  FOREMAN_ASSIGN_OR_RETURN(foreman::Tensor values, foreman::Tensor::FromVector<float>({-2, 0, 1, 1, 3.5}, {5}));
  FOREMAN_ASSIGN_OR_RETURN(std::string histo, foreman::HistogramSummary("weights", values));
  FOREMAN_RETURN_IF_ERROR(writer->AddSessionLog(foreman::SessionLogStatus::kStart, 0));
  FOREMAN_RETURN_IF_ERROR(writer->AddSummary(
      foreman::MergeSummaries({foreman::ScalarSummary("loss", 0.5f), histo, foreman::TextSummary("note", "hi")}), 1));
  FOREMAN_RETURN_IF_ERROR(
      writer->AddSessionLog(foreman::SessionLogStatus::kCheckpoint, 1, "/ckpt/model.ckpt-1"));
  FOREMAN_RETURN_IF_ERROR(writer->Close());
  FOREMAN_ASSIGN_OR_RETURN(std::string events, mem.ReadFileToString(writer->path()));
  FOREMAN_RETURN_IF_ERROR(foreman::WriteStringToFile(out, out_dir + "/record/events", events));

  // A checkpoint with every dtype.
  FOREMAN_RETURN_IF_ERROR(mem.CreateDir("/ckpt"));
  FOREMAN_ASSIGN_OR_RETURN(auto bundle, foreman::BundleWriter::Create(&mem, "/ckpt/all"));
  FOREMAN_RETURN_IF_ERROR(bundle->Add("f32", values));
  FOREMAN_RETURN_IF_ERROR(bundle->Add("f64", foreman::Tensor::Scalar<double>(2.5)));
  FOREMAN_RETURN_IF_ERROR(bundle->Add("global_step", foreman::Tensor::Scalar<int64_t>(7)));
  FOREMAN_RETURN_IF_ERROR(bundle->Add("i32", foreman::Tensor(foreman::DataType::kInt32, {2, 3})));
  FOREMAN_RETURN_IF_ERROR(bundle->Add("u8", foreman::Tensor(foreman::DataType::kUInt8, {4})));
  FOREMAN_ASSIGN_OR_RETURN(foreman::Tensor strings,
                           foreman::Tensor::FromVector<std::string>({"", "a", std::string(300, 'x')}, {3}));
  FOREMAN_RETURN_IF_ERROR(bundle->Add("strings", strings));
  FOREMAN_RETURN_IF_ERROR(bundle->Finish());
  FOREMAN_RETURN_IF_ERROR(SeedFromPrefix(&mem, "/ckpt/all", out, out_dir + "/checkpoint/all_dtypes"));

  // TensorFlow's own checkpoints.
  for (const char* name : {"serving-half_plus_three", "serving-half_plus_two_mkl"}) {
    FOREMAN_RETURN_IF_ERROR(SeedFromPrefix(Env::Default(), testdata + "/tf-checkpoints/" + name + "/variables", out,
                                           out_dir + "/checkpoint/" + name));
  }
  return absl::OkStatus();
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: make_corpus OUT_DIR TESTDATA_DIR\n");
    return 2;
  }
  Status s = Run(argv[1], argv[2]);
  if (!s.ok()) {
    std::fprintf(stderr, "make_corpus: %s\n", s.ToString().c_str());
    return 1;
  }
  return 0;
}
