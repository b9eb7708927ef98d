// What `foreman train` prints: its one-line errors, the progress on stderr
// (the MLP job's observer: a redrawn bar on a terminal, plain lines
// otherwise) and, at the end, the service restarts on stdout.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "foreman/mlp_job.hpp"
#include "foreman/restart_policy.hpp"
#include "foreman/status.hpp"

namespace foreman::cli {

/// Prints "foreman train: <what>: <message>" on stderr; returns `code`.
int Fail(int code, const std::string& what, const Status& s);
/// Prints "foreman train: <message>" on stderr (a message that names what
/// failed itself); returns `code`.
int Fail(int code, const Status& s);

/// The job's progress on stderr: step, steps/s, loss and ETA, a bar redrawn
/// at most every 100 ms on a terminal (`tty`), else a plain line every
/// `every_steps` global steps (at the first step at or past each multiple:
/// in a cluster global_step may advance by more than one between two of
/// this worker's steps); each new evaluation; the job's warnings
/// ("foreman train: warning: ..."). On the training thread.
class ProgressPrinter : public MlpJobObserver {
 public:
  ProgressPrinter(bool tty, int64_t every_steps);
  void OnStep(const MlpJobProgress& progress) override;
  void OnEval(const MlpJobEval& eval) override;
  void OnWarning(const std::string& warning) override;
  void OnEnd() override;

 private:
  void OnStepLine(const MlpJobProgress& p);
  void Draw(const MlpJobProgress& p);

  const bool tty_;
  const int64_t every_;
  bool drew_ = false;
  int64_t last_draw_us_ = -1;  // steady clock
  std::optional<int64_t> last_step_;  // the previous OnStep's global_step
};

/// Under --restart-policy: one line per restart or removal the session's
/// supervisor performed, on stdout (foreman chaos reads them), with every
/// summary step and checkpoint save it lost; the reason last (free text).
void PrintServiceRestarts(const std::vector<ServiceRestart>& restarts);

}  // namespace foreman::cli
