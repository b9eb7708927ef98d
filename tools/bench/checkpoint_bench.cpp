// Checkpoints (issue 6, part 3), for states of each size given:
//
//   stall          what a save costs the training loop: the duration of the
//                  MonitoredSession::run() at which CheckpointSaverHook starts
//                  a save (listeners' before_save: none; Session::Snapshot;
//                  hand-off to the checkpoint_saver actor). The loop runs
//                  steps back to back, with save_secs = 2x (write + cold
//                  copy) as measured, so a save normally finds the previous
//                  one done;
//                  the saves that still had to wait are counted apart.
//   write          the time of one Saver::Save (serialise, write, fsync,
//                  rename, state file): the call the checkpoint_saver actor
//                  makes for the hook, and the time it reports; from the
//                  buffers the previous save used, as the hook saves (after
//                  one untimed first save into new buffers, reported apart
//                  as write_first_s).
//   syncs_per_save the fdatasync/fsync calls of one save (WritableFile::Sync
//                  and Env::SyncDir counted through a forwarding Env).
//   stall_cpu      the same runs in CPU time of the training thread (on a
//                  shared machine, without the time others held the core);
//   memcpy         copying the same tensors into buffers touched before (the
//                  copy itself: the goal's baseline; also in CPU time,
//                  memcpy_warm_cpu_s), and into fresh pages
//                  from the kernel (mmap: every page faults in, the worst
//                  case of a copy into new memory).
//   dd             `dd if=/dev/zero of=<dir>/dd.bin bs=1M count=<MiB>
//                  conv=fdatasync` into the same directory.
//   dd_nsync       the same bytes with as many syncs as one save makes (N =
//                  syncs_per_save): `dd bs=<size/N> count=N oflag=dsync`, a
//                  write + fdatasync per block, in one process.
//   torch.save     (with --torch CMD) CMD --mb N --dir DIR: the same tensors
//                  saved by torch.save and fsync'ed, timed in Python.
// Runs of the different methods alternate; every figure is over --reps runs.
//
//   checkpoint_bench [--sizes-mb 10,100,1000] [--reps 5] [--dir PARENT] [--torch CMD]
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "bench_util.hpp"
#include "checkpoint_peers.hpp"
#include "foreman/checkpoint.hpp"
#include "foreman/hooks.hpp"
#include "foreman/monitored_session.hpp"
#include "foreman/session.hpp"
#include "foreman/session_manager.hpp"
#include "foreman/variable_store.hpp"

namespace {

using foreman::Status;
using foreman_bench::Buffer;
using foreman_bench::NowSeconds;
using foreman_bench::PrintResult;

constexpr int64_t kMiB = 1 << 20;
// Variables of at most 16 MiB, like the layers of a model.
constexpr int64_t kChunkBytes = 16 * kMiB;

[[noreturn]] void Die(const std::string& what, const Status& s) {
  std::fprintf(stderr, "checkpoint_bench: %s: %s\n", what.c_str(), s.ToString().c_str());
  std::exit(1);
}

// name -> float32 tensor of the chunk's size, filled with a pattern.
foreman::Tensor Chunk(int64_t bytes) {
  foreman::Tensor t(foreman::DataType::kFloat, {bytes / 4});
  float* p = t.data<float>();
  for (int64_t j = 0; j < bytes / 4; ++j) p[j] = static_cast<float>(j % 1000) * 0.001f;
  return t;
}

std::string ChunkName(int i) {
  char name[32];
  std::snprintf(name, sizeof(name), "layer_%03d/kernel", i);
  return name;
}

std::map<std::string, foreman::Tensor> MakeState(int64_t mib) {
  std::map<std::string, foreman::Tensor> state;
  int64_t left = mib * kMiB;
  for (int i = 0; left > 0; ++i) {
    const int64_t bytes = std::min(left, kChunkBytes);
    state.emplace(ChunkName(i), Chunk(bytes));
    left -= bytes;
  }
  return state;
}

void RemoveCheckpoints(const std::string& dir) {
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) std::filesystem::remove_all(entry.path(), ec);
}

// CPU time of the calling thread: the stall without the time other processes
// of a shared machine took the core.
double ThreadCpuSeconds() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

// Minor page faults of the calling thread so far.
int64_t ThreadMinorFaults() {
  rusage ru;
  getrusage(RUSAGE_THREAD, &ru);
  return ru.ru_minflt;
}

// The stall as the training loop sees it, under a MonitoredSession with a
// CheckpointSaverHook saving every `save_secs`, until `saves` saves were
// started after the one at session creation.
struct StallRun {
  std::vector<double> stall_s;         // saves that found the previous one done
  std::vector<double> stall_cpu_s;     // the same runs in CPU time of the training thread
  std::vector<double> stall_faults;    // the same runs' page faults (minor) on the training thread
  std::vector<double> waited_stall_s;  // saves that had to wait for it
  double step_s = 0;                   // median duration of the other runs
};

StallRun MeasureStall(int64_t mib, int saves, double save_secs, const std::string& dir) {
  auto graph = std::make_shared<foreman::Graph>();
  if (Status s = graph->CreateGlobalStep(); !s.ok()) Die("graph", s);
  // The same variables as MakeState(mib), built when the session initializes them.
  int64_t left = mib * kMiB;
  for (int i = 0; left > 0; ++i) {
    const int64_t bytes = std::min(left, kChunkBytes);
    Status s = graph->AddVariable(ChunkName(i), [bytes]() -> foreman::StatusOr<foreman::Tensor> { return Chunk(bytes); });
    if (!s.ok()) Die("graph", s);
    left -= bytes;
  }
  (void)graph->SetStep([](foreman::StepContext& ctx) -> Status {
    FOREMAN_ASSIGN_OR_RETURN(int64_t step, foreman::IncrementGlobalStep(ctx.variables()));
    ctx.Set("train_op", foreman::Tensor::Scalar<int64_t>(step));
    return absl::OkStatus();
  });
  foreman::CheckpointSaverHook::Options hook_options;
  hook_options.checkpoint_dir = dir;
  hook_options.save_secs = save_secs;
  auto hook = foreman::CheckpointSaverHook::Create(hook_options);
  if (!hook.ok()) Die("CheckpointSaverHook", hook.status());
  foreman::SessionConfig config;
  config.intra_op_parallelism_threads = 1;
  foreman::MonitoredSessionOptions options;
  options.session_creator = std::make_shared<foreman::ChiefSessionCreator>(
      std::make_shared<foreman::Scaffold>(graph), "", config);
  options.hooks = {*hook};
  auto session = foreman::MonitoredSession::Create(std::move(options));
  if (!session.ok()) Die("MonitoredSession", session.status());

  struct LongRun {
    int64_t step;
    double seconds;
    double cpu_seconds;
    double faults;
    bool waited;
  };
  std::vector<LongRun> long_runs;
  std::vector<double> sample;  // every 1024th ordinary run
  const std::vector<std::string> fetches = {"train_op"};
  int64_t waited = 0;
  int64_t runs = 0;
  const double deadline = NowSeconds() + 60.0 + 4.0 * saves * save_secs;
  while ((*hook)->saved_steps().size() < static_cast<std::size_t>(saves + 1)) {
    const double start = NowSeconds();
    const double cpu_start = ThreadCpuSeconds();
    const int64_t faults_start = ThreadMinorFaults();
    auto out = (*session)->run(fetches);
    const double took = NowSeconds() - start;
    const double cpu_took = ThreadCpuSeconds() - cpu_start;
    const int64_t faults = ThreadMinorFaults() - faults_start;
    if (!out.ok()) Die("run", out.status());
    ++runs;
    if (took > 20e-6) {
      const int64_t w = (*hook)->waited_saves();
      long_runs.push_back({out->at("train_op").scalar<int64_t>().value(), took, cpu_took, static_cast<double>(faults), w > waited});
      waited = w;
    } else if (runs % 1024 == 0) {
      sample.push_back(took);
    }
    if (NowSeconds() > deadline) {
      std::fprintf(stderr, "checkpoint_bench: saves did not complete in time\n");
      std::exit(1);
    }
  }
  const std::vector<int64_t> saved = (*hook)->saved_steps();
  if (Status s = (*session)->close(); !s.ok()) Die("close", s);
  const std::set<int64_t> saved_set(saved.begin() + 1, saved.end());  // not the one at creation
  StallRun result;
  for (const LongRun& r : long_runs) {
    if (saved_set.count(r.step) == 0) continue;
    (r.waited ? result.waited_stall_s : result.stall_s).push_back(r.seconds);
    if (!r.waited) {
      result.stall_cpu_s.push_back(r.cpu_seconds);
      result.stall_faults.push_back(r.faults);
    }
  }
  result.step_s = foreman_bench::Summarize(sample).median;
  return result;
}

std::vector<int64_t> ParseSizes(const std::string& list) {
  std::vector<int64_t> sizes;
  std::stringstream in(list);
  std::string item;
  while (std::getline(in, item, ',')) {
    if (!item.empty()) sizes.push_back(std::atoll(item.c_str()));
  }
  return sizes;
}

}  // namespace

int main(int argc, char** argv) {
  std::string sizes_arg = "10,100,1000";
  int reps = 5;
  std::string parent;
  std::string torch_cmd;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "checkpoint_bench: %s needs a value\n", arg.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (arg == "--sizes-mb") {
      sizes_arg = value();
    } else if (arg == "--reps") {
      reps = std::max(1, std::atoi(value().c_str()));
    } else if (arg == "--dir") {
      parent = value();
    } else if (arg == "--torch") {
      torch_cmd = value();
    } else {
      std::fprintf(stderr, "usage: %s [--sizes-mb 10,100,1000] [--reps 5] [--dir PARENT] [--torch CMD]\n", argv[0]);
      return 2;
    }
  }
  foreman_bench::ScratchDir scratch(parent, "foreman_ckpt_bench");
  const std::string ckpt_dir = scratch.path() + "/ckpt";
  const std::string other_dir = scratch.path() + "/other";
  std::filesystem::create_directories(ckpt_dir);
  std::filesystem::create_directories(other_dir);
  std::printf("checkpoint_bench: directory %s, %d runs per figure\n", scratch.path().c_str(), reps);

  for (const int64_t mib : ParseSizes(sizes_arg)) {
    const std::string tag = std::to_string(mib) + "MB";
    const double bytes = static_cast<double>(mib * kMiB);
    std::vector<double> fresh, warm, warm_cpu, write, write_rate, syncs, dd, dd_rate, dd_nsync, dd_nsync_rate, torch,
        torch_rate;
    double write_first = 0;
    {
      const std::map<std::string, foreman::Tensor> state = MakeState(mib);
      std::vector<Buffer> dest;
      for (const auto& [name, t] : state) {
        Buffer b{foreman_bench::AllocateAligned(t.TotalBytes()), t.TotalBytes()};
        std::memset(b.data, 1, b.size);
        dest.push_back(b);
      }
      foreman_bench::SyncCountingEnv env;
      foreman::SaverOptions saver_options;
      saver_options.env = &env;
      std::shared_ptr<foreman::Saver> saver = foreman::Saver::Create(saver_options).value();
      const std::string save_path = ckpt_dir + "/model.ckpt";
      // One save as CheckpointSaverHook makes it: the snapshot is copied into
      // the buffers the previous save used (new ones the first time), then
      // Saver::Save writes them, timed as the checkpoint_saver actor times it;
      // returns that time and the syncs it made.
      std::map<std::string, foreman::Tensor> buffers;
      auto save = [&](int64_t step, double* took, int64_t* synced) {
        for (const auto& [name, t] : state) buffers[name] = t;  // in place once the buffers exist
        const int64_t before = env.syncs();
        const double start = NowSeconds();
        foreman::StatusOr<std::string> prefix = saver->Save(buffers, save_path, step);
        *took = NowSeconds() - start;
        if (!prefix.ok()) Die("save", prefix.status());
        *synced = env.syncs() - before;
      };
      int64_t nsync = 0;
      save(0, &write_first, &nsync);
      nsync = std::max<int64_t>(1, nsync);
      // dd writing the same bytes in `nsync` blocks, each made durable.
      const int64_t nsync_block = (mib * kMiB + nsync - 1) / nsync;
      for (int r = 0; r < reps; ++r) {
        fresh.push_back(foreman_bench::MemcpyFresh(state));
        const double cpu_start = ThreadCpuSeconds();
        warm.push_back(foreman_bench::MemcpyWarm(state, dest));
        warm_cpu.push_back(ThreadCpuSeconds() - cpu_start);
        double took = 0;
        int64_t synced = 0;
        save(r + 1, &took, &synced);
        write.push_back(took);
        syncs.push_back(static_cast<double>(synced));
        write_rate.push_back(bytes / kMiB / write.back());
        dd.push_back(foreman_bench::RunTimed("dd if=/dev/zero of='" + other_dir + "/dd.bin' bs=1M count=" + std::to_string(mib) +
                              " conv=fdatasync status=none"));
        dd_rate.push_back(bytes / kMiB / dd.back());
        std::filesystem::remove(other_dir + "/dd.bin");
        dd_nsync.push_back(foreman_bench::RunTimed("dd if=/dev/zero of='" + other_dir + "/dd.bin' bs=" + std::to_string(nsync_block) +
                                    " count=" + std::to_string(nsync) + " oflag=dsync status=none"));
        dd_nsync_rate.push_back(bytes / kMiB / dd_nsync.back());
        std::filesystem::remove(other_dir + "/dd.bin");
        if (!torch_cmd.empty()) {
          torch.push_back(foreman_bench::TorchSave(torch_cmd, mib, other_dir));
          torch_rate.push_back(bytes / kMiB / torch.back());
          RemoveCheckpoints(other_dir);
        }
      }
      for (Buffer& b : dest) foreman_bench::FreeAligned(b.data);
    }
    RemoveCheckpoints(ckpt_dir);

    // A save costs the copy (up to the cold memcpy) and then the write: due
    // every twice that, one normally finds the previous save done.
    const double save_secs =
        std::max(0.02, 2.0 * (foreman_bench::Summarize(write).median + foreman_bench::Summarize(fresh).median));
    StallRun stall = MeasureStall(mib, reps, save_secs, ckpt_dir);
    RemoveCheckpoints(ckpt_dir);

    PrintResult("ckpt." + tag + ".stall_s", stall.stall_s, "s");
    PrintResult("ckpt." + tag + ".stall_cpu_s", stall.stall_cpu_s, "s");
    PrintResult("ckpt." + tag + ".stall_page_faults", stall.stall_faults, "count");
    if (!stall.waited_stall_s.empty()) PrintResult("ckpt." + tag + ".waited_stall_s", stall.waited_stall_s, "s");
    std::printf("RESULT ckpt.%s.waited_saves median=%zu min=%zu max=%zu n=%zu unit=count\n", tag.c_str(),
                stall.waited_stall_s.size(), stall.waited_stall_s.size(), stall.waited_stall_s.size(),
                stall.stall_s.size() + stall.waited_stall_s.size());
    PrintResult("ckpt." + tag + ".step_s", {stall.step_s}, "s");
    PrintResult("ckpt." + tag + ".memcpy_fresh_s", fresh, "s");
    PrintResult("ckpt." + tag + ".memcpy_warm_s", warm, "s");
    PrintResult("ckpt." + tag + ".memcpy_warm_cpu_s", warm_cpu, "s");
    PrintResult("ckpt." + tag + ".write_s", write, "s");
    PrintResult("ckpt." + tag + ".write_MBps", write_rate, "MB/s");
    PrintResult("ckpt." + tag + ".write_first_s", {write_first}, "s");
    PrintResult("ckpt." + tag + ".syncs_per_save", syncs, "count");
    PrintResult("ckpt." + tag + ".dd_s", dd, "s");
    PrintResult("ckpt." + tag + ".dd_MBps", dd_rate, "MB/s");
    PrintResult("ckpt." + tag + ".dd_nsync_s", dd_nsync, "s");
    PrintResult("ckpt." + tag + ".dd_nsync_MBps", dd_nsync_rate, "MB/s");
    std::vector<double> vs_dd, vs_dd_nsync, vs_torch;  // per pair of alternating runs
    for (std::size_t i = 0; i < write.size(); ++i) {
      vs_dd.push_back(dd[i] / write[i]);
      vs_dd_nsync.push_back(dd_nsync[i] / write[i]);
      if (i < torch.size()) vs_torch.push_back(torch[i] / write[i]);
    }
    PrintResult("ckpt." + tag + ".write_vs_dd", vs_dd, "x");
    PrintResult("ckpt." + tag + ".write_vs_dd_nsync", vs_dd_nsync, "x");
    if (!torch.empty()) {
      PrintResult("ckpt." + tag + ".torch_save_s", torch, "s");
      PrintResult("ckpt." + tag + ".torch_save_MBps", torch_rate, "MB/s");
      PrintResult("ckpt." + tag + ".write_vs_torch", vs_torch, "x");
    }
  }
  return 0;
}
