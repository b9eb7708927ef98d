// Writes files with Foreman's public API for the independent Python verifiers
// (tests/interop_test.sh runs this, then tools/testing/verify_checkpoint.py
// and tools/testing/verify_events.py):
//
//   <dir>/ckpt/model.ckpt-7.index, .data-00000-of-00001, checkpoint   (Saver)
//   <dir>/ckpt/expected.txt        the tensors saved, one line each
//   <dir>/events/events.out.tfevents.<secs>.interop-host.v2            (EventFileWriter)
//   <dir>/events/expected.txt      the events written, in order
//
// The expected.txt formats are described in tools/testing/tfformat.py
// (tensors) and tools/testing/verify_events.py (events).
//
//   write_interop_samples <dir>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <limits>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "foreman/checkpoint.hpp"
#include "foreman/env.hpp"
#include "foreman/event_writer.hpp"
#include "foreman/status.hpp"
#include "foreman/summary.hpp"
#include "foreman/tensor.hpp"

namespace {

using foreman::DataType;
using foreman::Status;
using foreman::Tensor;
using foreman::TensorShape;

std::string Hex(const std::string& s) {
  static const char* digits = "0123456789abcdef";
  std::string out = "x";
  for (unsigned char c : s) {
    out.push_back(digits[c >> 4]);
    out.push_back(digits[c & 15]);
  }
  return out;
}

std::string FormatDouble(double v, int digits) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*g", digits, v);
  return buf;
}

std::string FormatValues(const Tensor& t) {
  std::ostringstream o;
  for (int64_t i = 0; i < t.num_elements(); ++i) {
    o << ' ';
    switch (t.dtype()) {
      case DataType::kFloat: o << FormatDouble(t.data<float>()[i], 9); break;
      case DataType::kDouble: o << FormatDouble(t.data<double>()[i], 17); break;
      case DataType::kInt32: o << t.data<int32_t>()[i]; break;
      case DataType::kInt64: o << t.data<int64_t>()[i]; break;
      case DataType::kUInt8: o << static_cast<int>(t.data<uint8_t>()[i]); break;
      case DataType::kString: o << Hex(t.data<std::string>()[i]); break;
      default: o << "?"; break;
    }
  }
  return o.str();
}

std::string TensorLine(const std::string& name, const Tensor& t) {
  return "tensor " + name + " " + foreman::DataTypeName(t.dtype()) + " " + t.shape().ToString() + " " +
         std::to_string(t.num_elements()) + FormatValues(t);
}

template <class T>
Tensor Make(std::vector<T> values, TensorShape shape) {
  auto t = Tensor::FromVector<T>(values, std::move(shape));
  if (!t.ok()) {
    std::cerr << "FromVector: " << t.status() << "\n";
    std::exit(1);
  }
  return *std::move(t);
}

#define CHECK_OK(expr)                                                   \
  do {                                                                   \
    const ::foreman::Status s_ = (expr);                                 \
    if (!s_.ok()) {                                                      \
      std::cerr << #expr << ": " << s_ << "\n";                          \
      return 1;                                                          \
    }                                                                    \
  } while (false)

int WriteCheckpoint(const std::string& dir) {
  foreman::Env* env = foreman::Env::Default();
  const std::string ckpt = foreman::JoinPath(dir, "ckpt");
  CHECK_OK(env->RecursivelyCreateDir(ckpt));

  const float fnan = std::numeric_limits<float>::quiet_NaN();
  const float finf = std::numeric_limits<float>::infinity();
  std::string long_string;
  for (int i = 0; i < 300; ++i) long_string.push_back(static_cast<char>('a' + i % 26));
  std::vector<uint8_t> u8;
  for (int i = 0; i < 24; ++i) u8.push_back(static_cast<uint8_t>((i * 11) % 256));

  std::map<std::string, Tensor> tensors;
  tensors["all/float32"] = Make<float>({-1.5f, 0.0f, 0.25f, std::numeric_limits<float>::max(), -0.0f,
                                        std::numeric_limits<float>::denorm_min()},
                                       {2, 3});
  tensors["all/float32_nan_inf"] = Make<float>({fnan, finf, -finf}, {3});
  tensors["all/float32_empty"] = Tensor(DataType::kFloat, {0});
  tensors["all/float64"] = Make<double>({0.1, -2.5, 1e300, std::numeric_limits<double>::denorm_min()}, {4});
  tensors["all/float64_scalar"] = Tensor::Scalar<double>(-2.718281828459045);
  tensors["all/int32"] = Make<int32_t>({std::numeric_limits<int32_t>::min(), -1, 0,
                                        std::numeric_limits<int32_t>::max()},
                                       {2, 2});
  tensors["all/int64"] = Tensor::Scalar<int64_t>((int64_t{1} << 53) + 1);
  tensors["all/int64_vector"] = Make<int64_t>({std::numeric_limits<int64_t>::min(), 0,
                                               std::numeric_limits<int64_t>::max()},
                                              {3});
  tensors["all/uint8"] = Make<uint8_t>(u8, {2, 3, 4});
  tensors["all/string_scalar"] = Tensor::Scalar<std::string>("hello");
  tensors["all/strings"] = Make<std::string>(
      {"", "a", long_string, "h\xc3\xa9llo", std::string("\xff\x00\x80", 3)}, {5});
  tensors["all/strings_empty"] = Tensor(DataType::kString, {0});
  tensors["all/strings_2x2"] = Make<std::string>({"r0c0", "r0c1", "", "r1c1"}, {2, 2});
  tensors["model/layer_with_weights-0/kernel/.ATTRIBUTES/VARIABLE_VALUE"] = Make<float>({0.5f}, {1});
  tensors["global_step"] = Tensor::Scalar<int64_t>(7);
  // Enough entries for an index of several blocks.
  for (int i = 0; i < 150; ++i) {
    char name[64];
    std::snprintf(name, sizeof name, "layer_%03d/kernel", i);
    tensors[name] = Make<float>({static_cast<float>(i), static_cast<float>(i) * -0.5f}, {2});
  }

  foreman::SaverOptions options;
  auto saver = foreman::Saver::Create(options);
  CHECK_OK(saver.status());
  auto prefix = (*saver)->Save(tensors, foreman::JoinPath(ckpt, "model.ckpt"), 7);
  CHECK_OK(prefix.status());

  std::ofstream out(foreman::JoinPath(ckpt, "expected.txt"));
  out << "# tensors saved by write_interop_samples as " << *prefix << "\n";
  for (const auto& [name, t] : tensors) out << TensorLine(name, t) << "\n";
  if (!out.good()) {
    std::cerr << "cannot write " << foreman::JoinPath(ckpt, "expected.txt") << "\n";
    return 1;
  }
  std::cout << *prefix << "\n";
  return 0;
}

int WriteEvents(const std::string& dir) {
  const std::string logdir = foreman::JoinPath(dir, "events");
  foreman::EventFileWriterOptions options;
  options.hostname = "interop-host";
  options.filename_suffix = ".v2";
  options.max_queue = 3;   // some flushes happen before Close()
  auto writer = foreman::EventFileWriter::Create(logdir, options);
  CHECK_OK(writer.status());
  foreman::EventFileWriter& w = **writer;

  std::ostringstream exp;
  exp << "# events written by write_interop_samples, in order\n"
      << "file_name_host interop-host\n"
      << "file_name_suffix .v2\n"
      << "file_version brain.Event:2\n";

  // step 1, 2: scalars
  CHECK_OK(w.AddSummary(foreman::ScalarSummary("loss", 0.25f), 1));
  exp << "event 1 summary\nvalue scalar loss " << FormatDouble(0.25f, 9) << "\n";
  CHECK_OK(w.AddSummary(foreman::ScalarSummary("loss", 0.1f), 2));
  exp << "event 2 summary\nvalue scalar loss " << FormatDouble(0.1f, 9) << "\n";

  // steps 3-5: histograms of float32, int32 and an empty tensor
  const std::vector<std::pair<std::string, Tensor>> histos = {
      {"weights", Make<float>({-3.5f, -1e-13f, 0.0f, 0.0f, 1e-12f, 0.5f, 0.5f, 2.0f, 100.0f, 1e21f}, {2, 5})},
      {"ints", Make<int32_t>({1, 2, 3, 3, 3, -7}, {6})},
      {"empty", Tensor(DataType::kFloat, {0})},
  };
  int64_t step = 3;
  for (const auto& [tag, values] : histos) {
    auto s = foreman::HistogramSummary(tag, values);
    CHECK_OK(s.status());
    CHECK_OK(w.AddSummary(*s, step));
    exp << "event " << step << " summary\nvalue histogram " << tag << " " << foreman::DataTypeName(values.dtype())
        << " " << values.num_elements() << FormatValues(values) << "\n";
    ++step;
  }

  // steps 6, 7: text twice under one tag (B150: metadata only the first time)
  const std::string text1 = "h\xc3\xa9llo w\xc3\xb6rld";
  CHECK_OK(w.AddSummary(foreman::TextSummary("note", text1), 6));
  exp << "event 6 summary\nvalue text note " << Hex(text1) << "\n";
  CHECK_OK(w.AddSummary(foreman::TextSummary("note", "second"), 7));
  exp << "event 7 summary\nvalue text note " << Hex("second") << "\n";

  // step 8: one event with three merged values
  {
    auto h = foreman::HistogramSummary("h2", Make<double>({1.0, 2.0, 3.0}, {3}));
    CHECK_OK(h.status());
    const std::string merged = foreman::MergeSummaries(
        {foreman::ScalarSummary("acc", 0.75f), foreman::TextSummary("note2", "merged"), *h});
    CHECK_OK(w.AddSummary(merged, 8));
    exp << "event 8 summary\n"
        << "value scalar acc " << FormatDouble(0.75f, 9) << "\n"
        << "value text note2 " << Hex("merged") << "\n"
        << "value histogram h2 float64 3 1 2 3\n";
  }

  // session logs: START with the restored step, CHECKPOINT, STOP without a step
  const std::string path = "/tmp/ckpt/model.ckpt-8";
  CHECK_OK(w.AddSessionLog(foreman::SessionLogStatus::kStart, 8, "", "restored"));
  exp << "event 8 session_log START " << Hex("") << " " << Hex("restored") << "\n";
  CHECK_OK(w.AddSessionLog(foreman::SessionLogStatus::kCheckpoint, 9, path, ""));
  exp << "event 9 session_log CHECKPOINT " << Hex(path) << " " << Hex("") << "\n";
  CHECK_OK(w.AddSummary(foreman::ScalarSummary("loss", -1.0f), 10));
  exp << "event 10 summary\nvalue scalar loss " << FormatDouble(-1.0f, 9) << "\n";
  CHECK_OK(w.AddSessionLog(foreman::SessionLogStatus::kStop, std::nullopt));
  exp << "event - session_log STOP " << Hex("") << " " << Hex("") << "\n";
  CHECK_OK(w.Close());

  std::ofstream out(foreman::JoinPath(logdir, "expected.txt"));
  out << exp.str();
  if (!out.good()) {
    std::cerr << "cannot write " << foreman::JoinPath(logdir, "expected.txt") << "\n";
    return 1;
  }
  std::cout << w.path() << "\n";
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::cerr << "usage: " << argv[0] << " <dir>\n";
    return 2;
  }
  const std::string dir = argv[1];
  if (int rc = WriteCheckpoint(dir); rc != 0) return rc;
  return WriteEvents(dir);
}
