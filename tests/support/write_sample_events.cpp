// Writes one event file with known contents into the directory given as the
// first argument, for events_cli_test.sh. Wall time starts at 1700000000 s and
// advances 0.5 s per step; the host name is "testhost". With --hostile as
// the second argument, the file holds instead a tag, a checkpoint path and a
// text with control characters, a bidi override and a byte that is not UTF-8.
#include <cstdio>
#include <memory>
#include <optional>
#include <string>

#include "foreman/clock.hpp"
#include "foreman/event_writer.hpp"
#include "foreman/summary.hpp"

namespace {

// A writer into `logdir` on `clock`, as host "testhost".
foreman::StatusOr<std::unique_ptr<foreman::EventFileWriter>> SampleWriter(const std::string& logdir,
                                                                          foreman::ManualClock* clock) {
  foreman::EventFileWriterOptions options;
  options.clock = clock;
  options.hostname = "testhost";
  return foreman::EventFileWriter::Create(logdir, options);
}

foreman::Status WriteSample(const std::string& logdir) {
  foreman::ManualClock clock;
  FOREMAN_ASSIGN_OR_RETURN(auto writer, SampleWriter(logdir, &clock));
  FOREMAN_RETURN_IF_ERROR(writer->AddSessionLog(foreman::SessionLogStatus::kStart, 0));
  clock.Advance(absl::Milliseconds(500));
  FOREMAN_ASSIGN_OR_RETURN(
      std::string histogram,
      foreman::HistogramSummary("weights", *foreman::Tensor::FromVector<float>({0, 1, 1, 2, -3}, {5})));
  FOREMAN_RETURN_IF_ERROR(writer->AddSummary(
      foreman::MergeSummaries({foreman::ScalarSummary("loss", 0.25f), histogram,
                               foreman::TextSummary("note", "say \"hi\"\n\x01 \xe2\x9c\x93")}),
      1));
  clock.Advance(absl::Milliseconds(500));
  FOREMAN_RETURN_IF_ERROR(writer->AddSummary(foreman::ScalarSummary("loss", 0.125f), 2));
  FOREMAN_RETURN_IF_ERROR(
      writer->AddSessionLog(foreman::SessionLogStatus::kCheckpoint, 2, "/ckpt/model.ckpt-2"));
  FOREMAN_RETURN_IF_ERROR(writer->AddSessionLog(foreman::SessionLogStatus::kStop, std::nullopt));
  return writer->Close();
}

foreman::Status WriteHostile(const std::string& logdir) {
  foreman::ManualClock clock;
  FOREMAN_ASSIGN_OR_RETURN(auto writer, SampleWriter(logdir, &clock));
  FOREMAN_RETURN_IF_ERROR(writer->AddSummary(
      foreman::MergeSummaries({foreman::ScalarSummary("loss\nstep 9  wall 0  scalar  loss = 0\x1b[2J", 0.5f),
                               foreman::TextSummary("note\xe2\x80\xae", "a\rb\xff")}),
      1));
  FOREMAN_RETURN_IF_ERROR(writer->AddSessionLog(foreman::SessionLogStatus::kCheckpoint, 1, "/ckpt/x\tmodel.ckpt-1"));
  return writer->Close();
}

}  // namespace

int main(int argc, char** argv) {
  const bool hostile = argc == 3 && std::string(argv[2]) == "--hostile";
  if (argc != 2 && !hostile) {
    std::fprintf(stderr, "usage: %s LOGDIR [--hostile]\n", argv[0]);
    return 2;
  }
  foreman::Status s = hostile ? WriteHostile(argv[1]) : WriteSample(argv[1]);
  if (!s.ok()) {
    std::fprintf(stderr, "%s\n", s.ToString().c_str());
    return 1;
  }
  return 0;
}
