// Runs every C++ example of the public headers and the docs (generated into
// doc_examples.cpp by tests/doc_examples.py), each in a fresh temporary
// working directory, and fails when one returns an error. That they compile
// at all is the other half of the test.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "doc_example_fixture.hpp"
#include "foreman/hooks.hpp"
#include "foreman/logging.hpp"
#include "foreman/summary.hpp"
#include "foreman/event_writer.hpp"

namespace foreman_doc {

namespace {
// The step shared by ExampleGraph and ExampleJob: loss = w², SGD with rate 0.1.
foreman::Status Step(foreman::StepContext& ctx) {
  FOREMAN_ASSIGN_OR_RETURN(foreman::Tensor * w, ctx.variables().Get("w"));
  float& value = w->data<float>()[0];
  const float loss = value * value;
  ctx.Set("loss", foreman::Tensor::Scalar<float>(loss));
  ctx.Set("summaries", foreman::Tensor::Scalar<std::string>(foreman::ScalarSummary("loss", loss)));
  if (ctx.requested("train_op")) {
    value -= 0.1f * 2 * value;
    FOREMAN_RETURN_IF_ERROR(foreman::IncrementGlobalStep(ctx.variables()).status());
  }
  return foreman::Status();
}
}  // namespace

std::shared_ptr<foreman::Graph> ExampleGraph() {
  auto graph = std::make_shared<foreman::Graph>();
  foreman::Status s = graph->CreateGlobalStep();
  if (s.ok()) s = graph->AddVariable("w", foreman::Tensor::Scalar<float>(5.0f));
  if (s.ok()) s = graph->AddSummaryOp("summaries");
  if (s.ok()) s = graph->SetStep(&Step);
  if (!s.ok()) std::fprintf(stderr, "ExampleGraph: %s\n", s.ToString().c_str());
  return graph;
}

void FillExampleVariables(foreman::VariableStore& vars) {
  (void)vars.Create("dense/kernel", ExampleKernel());
  (void)foreman::CreateGlobalStep(vars);
  (void)foreman::IncrementGlobalStep(vars, 100);
}

foreman::Tensor ExampleKernel() {
  foreman::Tensor t(foreman::DataType::kFloat, {2, 3});
  for (int i = 0; i < 6; ++i) t.data<float>()[i] = 0.5f * static_cast<float>(i);
  return t;
}

std::string ExampleEventFile() {
  auto writer = foreman::EventFileWriter::Create("example_events");
  if (!writer.ok()) return "";
  for (int64_t step = 1; step <= 3; ++step) {
    (void)(*writer)->AddSummary(foreman::ScalarSummary("loss", 1.0f / static_cast<float>(step)), step);
  }
  (void)(*writer)->Close();
  return (*writer)->path();
}

std::shared_ptr<const foreman::data::Dataset> ExampleDataset() {
  foreman::data::LabeledImages data{foreman::Tensor(foreman::DataType::kUInt8, {10, 2, 2}),
                                    foreman::Tensor(foreman::DataType::kUInt8, {10})};
  foreman::data::DatasetOptions options;
  options.batch_size = 4;
  options.epochs = 2;
  auto dataset = foreman::data::Dataset::Create(std::move(data), options);
  return dataset.ok() ? *dataset : nullptr;
}

foreman::data::FashionMnist ExampleImages() {
  auto images = [](int64_t n) {
    foreman::data::LabeledImages data{foreman::Tensor(foreman::DataType::kUInt8, {n, 4, 4}),
                                      foreman::Tensor(foreman::DataType::kUInt8, {n})};
    uint8_t* pixels = data.images.data<uint8_t>();
    uint8_t* labels = data.labels.data<uint8_t>();
    for (int64_t i = 0; i < n; ++i) {
      labels[i] = static_cast<uint8_t>(i % 10);
      for (int64_t p = 0; p < 16; ++p) pixels[i * 16 + p] = p % 10 == i % 10 ? 255 : static_cast<uint8_t>(p * 7);
    }
    return data;
  };
  return foreman::data::FashionMnist{images(100), images(20)};
}

std::shared_ptr<foreman::SessionRunHook> ExampleStopAtStepHook() {
  foreman::StopAtStepHook::Options options;
  options.last_step = 200;
  auto hook = foreman::StopAtStepHook::Create(options);
  return hook.ok() ? *hook : nullptr;
}

foreman::TrainingJob ExampleJob() {
  foreman::TrainingJob job;
  job.options.graph = ExampleGraph();
  job.options.checkpoint_dir = "job_dir";
  foreman::StopAtStepHook::Options stop;
  stop.last_step = 50;
  job.options.hooks = {foreman::StopAtStepHook::Create(stop).value()};
  job.fetches = {"train_op", "loss"};
  job.progress_every_steps = 10;
  return job;
}

std::string FreeLoopbackHosts(int n) {
  // Bound together (distinct ports), then released for the example's Servers.
  std::vector<int> fds;
  std::string hosts;
  for (int i = 0; i < n; ++i) {
    int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    if (fd < 0 || ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
        ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
      std::perror("FreeLoopbackHosts");
      std::abort();
    }
    fds.push_back(fd);
    hosts += (i > 0 ? ",127.0.0.1:" : "127.0.0.1:") + std::to_string(ntohs(a.sin_port));
  }
  for (int fd : fds) ::close(fd);
  return hosts;
}

}  // namespace foreman_doc

int main() {
  const char* base = std::getenv("TEST_TMPDIR");
  std::filesystem::path root = base != nullptr ? base : "/tmp";
  std::filesystem::create_directories(root);
  const std::filesystem::path start = std::filesystem::current_path();
  int failed = 0;
  for (const foreman_doc::Example& example : foreman_doc::Examples()) {
    std::string dir = (root / "doc_example.XXXXXX").string();
    if (mkdtemp(dir.data()) == nullptr) {
      std::perror("mkdtemp");
      return 1;
    }
    std::filesystem::current_path(dir);
    foreman_doc::Fixture fx;
    foreman::Status s = example.run(fx);
    // An example may reconfigure logging (logging.hpp's): restore the default.
    (void)foreman::ConfigureLogging(foreman::LogOptions());
    std::filesystem::current_path(start);
    std::error_code ignored;
    std::filesystem::remove_all(dir, ignored);
    std::printf("%s %s%s%s\n", s.ok() ? "ok  " : "FAIL", example.where, s.ok() ? "" : ": ",
                s.ok() ? "" : s.ToString().c_str());
    if (!s.ok()) ++failed;
  }
  std::printf("%zu examples, %d failed\n", foreman_doc::Examples().size(), failed);
  return failed == 0 && !foreman_doc::Examples().empty() ? 0 : 1;
}
