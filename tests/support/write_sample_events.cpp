// Writes one event file with known contents into the directory given as the
// only argument, for events_cli_test.sh. Wall time starts at 1700000000 s and
// advances 0.5 s per step; the host name is "testhost".
#include <cstdio>
#include <optional>
#include <string>

#include "foreman/clock.hpp"
#include "foreman/event_writer.hpp"
#include "foreman/summary.hpp"

namespace {

foreman::Status WriteSample(const std::string& logdir) {
  foreman::ManualClock clock;
  foreman::EventFileWriterOptions options;
  options.clock = &clock;
  options.hostname = "testhost";
  FOREMAN_ASSIGN_OR_RETURN(auto writer, foreman::EventFileWriter::Create(logdir, options));
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

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s LOGDIR\n", argv[0]);
    return 2;
  }
  foreman::Status s = WriteSample(argv[1]);
  if (!s.ok()) {
    std::fprintf(stderr, "%s\n", s.ToString().c_str());
    return 1;
  }
  return 0;
}
