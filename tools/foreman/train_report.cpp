// What `foreman train` prints (train_report.hpp).
#include "train_report.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "foreman/hooks.hpp"
#include "foreman/logging.hpp"

namespace foreman::cli {
namespace {

std::string FormatDuration(double secs) {
  if (!std::isfinite(secs) || secs < 0) return "?";
  const int64_t s = static_cast<int64_t>(secs + 0.5);
  if (s >= 3600) return absl::StrFormat("%dh%02dm", s / 3600, (s / 60) % 60);
  if (s >= 60) return absl::StrFormat("%dm%02ds", s / 60, s % 60);
  return absl::StrFormat("%ds", s);
}

std::string TotalSuffix(const MlpJobProgress& p) { return p.total_steps > 0 ? absl::StrCat("/", p.total_steps) : ""; }

std::string Eta(const MlpJobProgress& p) {
  if (p.total_steps <= 0) return "?";
  // A cluster's final global_step can pass the total by updates in flight.
  if (p.global_step >= p.total_steps) return "0s";
  if (p.steps_per_sec <= 0) return "?";
  return FormatDuration(static_cast<double>(p.total_steps - p.global_step) / p.steps_per_sec);
}

int64_t SteadyMicros() {
  return std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace

int Fail(int code, const std::string& what, const Status& s) {
  std::fprintf(stderr, "foreman train: %s: %s\n", what.c_str(), EscapeForTerminal(s.message()).c_str());
  return code;
}

int Fail(int code, const Status& s) {
  std::fprintf(stderr, "foreman train: %s\n", EscapeForTerminal(s.message()).c_str());
  return code;
}

ProgressPrinter::ProgressPrinter(bool tty, int64_t every_steps) : tty_(tty), every_(std::max<int64_t>(every_steps, 1)) {}

void ProgressPrinter::OnStep(const MlpJobProgress& p) {
  OnStepLine(p);
  last_step_ = p.global_step;
}

void ProgressPrinter::OnStepLine(const MlpJobProgress& p) {
  if (tty_) {
    const int64_t now = SteadyMicros();
    if (last_draw_us_ < 0 || now - last_draw_us_ >= 100'000 || (p.total_steps > 0 && p.global_step >= p.total_steps)) {
      last_draw_us_ = now;
      Draw(p);
    }
  } else if (const int64_t from = last_step_ && *last_step_ < p.global_step ? *last_step_ : p.global_step - 1;
             StepMultiplesCrossed(from, p.global_step, every_) > 0) {
    // At the first step at or past each multiple: in a cluster global_step
    // may advance by more than one between two of this worker's steps (a
    // recovery that rewound it starts over).
    std::fprintf(stderr, "step %lld%s: loss %.4f, batch accuracy %.4f, %.1f steps/s, ETA %s\n",
                 static_cast<long long>(p.global_step), TotalSuffix(p).c_str(), p.loss, p.accuracy, p.steps_per_sec,
                 Eta(p).c_str());
  }
}

void ProgressPrinter::Draw(const MlpJobProgress& p) {
  constexpr int kWidth = 24;
  std::string bar;
  if (p.total_steps > 0) {
    const int filled =
        static_cast<int>(kWidth * std::min<double>(1.0, static_cast<double>(p.global_step) / p.total_steps));
    bar = absl::StrCat("[", std::string(filled, '#'), std::string(kWidth - filled, '.'), "] ");
  }
  std::fprintf(stderr, "\r\033[K%sstep %lld%s  %.1f steps/s  loss %.4f  ETA %s", bar.c_str(),
               static_cast<long long>(p.global_step), TotalSuffix(p).c_str(), p.steps_per_sec, p.loss, Eta(p).c_str());
  std::fflush(stderr);
  drew_ = true;
}

void ProgressPrinter::OnEval(const MlpJobEval& eval) {
  std::fprintf(stderr, "%seval at step %lld: test accuracy %.4f, test loss %.4f\n", tty_ && drew_ ? "\r\033[K" : "",
               static_cast<long long>(eval.global_step), eval.accuracy, eval.loss);
}

void ProgressPrinter::OnWarning(const std::string& warning) {
  // The bar (if any) is erased first; the warning is a line of its own.
  std::fprintf(stderr, "%sforeman train: warning: %s\n", tty_ ? "\r\033[K" : "", EscapeForTerminal(warning).c_str());
}

void ProgressPrinter::OnEnd() {
  if (tty_ && drew_) std::fprintf(stderr, "\n");
}

void PrintServiceRestarts(const std::vector<ServiceRestart>& restarts) {
  int n = 0;
  for (const ServiceRestart& r : restarts) {
    std::string line = absl::StrCat("service restart ", ++n, ": ", r.service, r.restarted ? " restarted" : " removed");
    if (r.events_lost >= 0) {
      absl::StrAppend(&line, "; summary steps lost: [", absl::StrJoin(r.steps_lost, ", "), "]");
    }
    if (!r.saves_lost.empty()) absl::StrAppend(&line, "; checkpoint saves lost: [", absl::StrJoin(r.saves_lost, ", "), "]");
    if (r.by_strategy && r.restarted) {
      absl::StrAppend(&line, "; stopped with a failed sibling (the restart strategy)");
    } else {
      absl::StrAppend(&line, "; after: ",
                      r.reason.ok() ? "a normal exit" : r.reason.ToString(absl::StatusToStringMode::kWithNoExtraData));
    }
    std::printf("%s\n", line.c_str());
  }
  if (n > 0) std::fflush(stdout);
}

}  // namespace foreman::cli
