// Writes the fuzzers' seed corpus: valid event files and valid checkpoints
// (in checkpoint_fuzzer's layout), from Foreman's writers and from the real
// TensorFlow checkpoints in tests/testdata; small IDX files, plain and gzipped.
// Usage: make_corpus OUT_DIR TESTDATA_DIR
//   (creates OUT_DIR/record, OUT_DIR/checkpoint, OUT_DIR/idx)
#include <zlib.h>

#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "foreman/bundle.hpp"
#include "foreman/event_writer.hpp"
#include "foreman/mem_env.hpp"
#include "foreman/summary.hpp"

namespace {

using foreman::Env;
using foreman::Status;
template <class T>
using StatusOr = foreman::StatusOr<T>;

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

/// An IDX file of unsigned bytes with `dims`, element i = i * 37.
std::string Idx(const std::vector<uint32_t>& dims) {
  std::string out = {'\0', '\0', '\x08', static_cast<char>(dims.size())};
  size_t n = 1;
  for (uint32_t d : dims) {
    for (int shift = 24; shift >= 0; shift -= 8) out.push_back(static_cast<char>((d >> shift) & 0xFF));
    n *= d;
  }
  for (size_t i = 0; i < n; ++i) out.push_back(static_cast<char>(i * 37));
  return out;
}

StatusOr<std::string> Gzip(const std::string& in) {
  z_stream zs;
  std::memset(&zs, 0, sizeof(zs));
  if (deflateInit2(&zs, Z_BEST_COMPRESSION, Z_DEFLATED, 16 + MAX_WBITS, 8, Z_DEFAULT_STRATEGY) != Z_OK) {
    return absl::InternalError("deflateInit2 failed");
  }
  std::string out(deflateBound(&zs, in.size()) + 32, '\0');
  zs.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(in.data()));
  zs.avail_in = static_cast<uInt>(in.size());
  zs.next_out = reinterpret_cast<Bytef*>(&out[0]);
  zs.avail_out = static_cast<uInt>(out.size());
  const int rc = deflate(&zs, Z_FINISH);
  out.resize(zs.total_out);
  deflateEnd(&zs);
  if (rc != Z_STREAM_END) return absl::InternalError("deflate failed");
  return out;
}

Status WriteIdxSeeds(Env* out, const std::string& dir) {
  FOREMAN_RETURN_IF_ERROR(out->RecursivelyCreateDir(dir));
  const std::string labels = Idx({7});
  const std::string images = Idx({3, 4, 5});
  FOREMAN_RETURN_IF_ERROR(foreman::WriteStringToFile(out, dir + "/labels-idx1-ubyte", labels));
  FOREMAN_RETURN_IF_ERROR(foreman::WriteStringToFile(out, dir + "/images-idx3-ubyte", images));
  FOREMAN_ASSIGN_OR_RETURN(std::string labels_gz, Gzip(labels));
  FOREMAN_ASSIGN_OR_RETURN(std::string images_gz, Gzip(images));
  FOREMAN_RETURN_IF_ERROR(foreman::WriteStringToFile(out, dir + "/labels-idx1-ubyte.gz", labels_gz));
  FOREMAN_RETURN_IF_ERROR(foreman::WriteStringToFile(out, dir + "/images-idx3-ubyte.gz", images_gz));
  // Two gzip members, as `cat a.gz b.gz` makes.
  FOREMAN_ASSIGN_OR_RETURN(std::string head_gz, Gzip(images.substr(0, 20)));
  FOREMAN_ASSIGN_OR_RETURN(std::string tail_gz, Gzip(images.substr(20)));
  return foreman::WriteStringToFile(out, dir + "/images-two-members.gz", head_gz + tail_gz);
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

  FOREMAN_RETURN_IF_ERROR(WriteIdxSeeds(out, out_dir + "/idx"));

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
