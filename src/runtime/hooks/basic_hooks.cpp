// The stock hooks that need no service actor (TF: basic_session_run_hooks.py;
// spec §9): SecondOrStepTimer (B95-B97), StopAtStepHook (B98-B101, decision
// 9), LoggingTensorHook (B117-B118), NanTensorHook (B119),
// GlobalStepWaiterHook (B120), FinalOpsHook (B121), FeedFnHook (B122) and
// ProfilerHook (B123). Everything here runs on the training thread.
#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <limits>
#include <set>
#include <unordered_map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "foreman/hooks.hpp"
#include "platform/log.hpp"
#include "runtime/hooks/global_step.hpp"

namespace foreman {

// -- SecondOrStepTimer ------------------------------------------------------------

StatusOr<SecondOrStepTimer> SecondOrStepTimer::Create(std::optional<double> every_secs,
                                                      std::optional<int64_t> every_steps, Clock* clock) {
  // B95, in TF's order of checks.
  if (!every_secs.has_value() && !every_steps.has_value()) {
    return absl::InvalidArgumentError("Either every_secs or every_steps should be provided.");
  }
  if (every_secs.has_value() && every_steps.has_value()) {
    return absl::InvalidArgumentError("Can not provide both every_secs and every_steps.");
  }
  return SecondOrStepTimer(every_secs, every_steps, clock == nullptr ? Clock::Real() : clock);
}

SecondOrStepTimer::SecondOrStepTimer(std::optional<double> every_secs, std::optional<int64_t> every_steps,
                                     Clock* clock)
    : every_secs_(every_secs), every_steps_(every_steps), clock_(clock) {}

bool SecondOrStepTimer::should_trigger_for_step(int64_t step) const {
  if (!last_step_.has_value()) return true;
  if (*last_step_ == step) return false;
  if (every_secs_.has_value() &&
      absl::ToDoubleSeconds(clock_->MonotonicNow() - last_time_) >= *every_secs_) {
    return true;
  }
  if (every_steps_.has_value() && step >= *last_step_ + *every_steps_) return true;
  return false;
}

std::optional<std::pair<double, int64_t>> SecondOrStepTimer::update_last_triggered_step(int64_t step) {
  const absl::Duration now = clock_->MonotonicNow();
  std::optional<std::pair<double, int64_t>> elapsed;
  if (last_step_.has_value()) elapsed.emplace(absl::ToDoubleSeconds(now - last_time_), step - *last_step_);
  last_time_ = now;
  last_step_ = step;
  return elapsed;
}

void SecondOrStepTimer::reset() {
  last_step_.reset();
  last_time_ = absl::ZeroDuration();
}

// -- StopAtStepHook ------------------------------------------------------------------

StatusOr<std::shared_ptr<StopAtStepHook>> StopAtStepHook::Create(std::optional<int64_t> num_steps,
                                                                 std::optional<int64_t> last_step) {
  // B98, TF's messages.
  if (!num_steps.has_value() && !last_step.has_value()) {
    return absl::InvalidArgumentError("One of num_steps or last_step must be specified.");
  }
  if (num_steps.has_value() && last_step.has_value()) {
    return absl::InvalidArgumentError("Only one of num_steps or last_step can be specified.");
  }
  return std::shared_ptr<StopAtStepHook>(new StopAtStepHook(num_steps, last_step));
}

StopAtStepHook::StopAtStepHook(std::optional<int64_t> num_steps, std::optional<int64_t> last_step)
    : num_steps_(num_steps), last_step_(last_step) {}

Status StopAtStepHook::after_create_session(Session* session, Coordinator* coord) {
  FOREMAN_RETURN_IF_ERROR(internal::RequireGlobalStep(session, *this));
  FOREMAN_ASSIGN_OR_RETURN(const int64_t step, internal::RealGlobalStep(session, *this));
  if (!last_step_.has_value()) last_step_ = step + *num_steps_;  // B99: once
  if (step >= *last_step_) {
    // Decision 9: TF would train one more step here (B101).
    FOREMAN_LOG_INFO("StopAtStepHook: global_step {} is already at or past last_step {}; stopping before the "
                     "first step.",
                     step, *last_step_);
    if (coord != nullptr) FOREMAN_RETURN_IF_ERROR(coord->request_stop());
  }
  return absl::OkStatus();
}

StatusOr<SessionRunArgs> StopAtStepHook::before_run(SessionRunContext& /*ctx*/) {
  SessionRunArgs args;
  args.fetches = {"global_step"};
  return args;
}

Status StopAtStepHook::after_run(SessionRunContext& ctx, const SessionRunValues& values) {
  if (!last_step_.has_value()) {
    return absl::FailedPreconditionError("StopAtStepHook: after_run before after_create_session.");
  }
  FOREMAN_ASSIGN_OR_RETURN(const int64_t stale, internal::StaleGlobalStep(values, *this));
  // B100: only a run that may have reached last_step pays for the extra read.
  if (stale + 1 >= *last_step_) {
    FOREMAN_ASSIGN_OR_RETURN(const int64_t step, internal::RealGlobalStep(ctx.session(), *this));
    if (step >= *last_step_) ctx.request_stop();
  }
  return absl::OkStatus();
}

// -- FormatTensorForLog ----------------------------------------------------------------

namespace {

/// The shortest digits that read back as `x` (finite, non-zero), and the
/// decimal exponent of the first one: x = d.ddd * 10^exp.
template <class T>
void ShortestDigits(T x, std::string* digits, int* exp) {
  char buf[64];
  const std::to_chars_result r = std::to_chars(buf, buf + sizeof(buf), x, std::chars_format::scientific);
  std::string s(buf, r.ptr);  // "-1.2345e+06"
  if (!s.empty() && s[0] == '-') s.erase(0, 1);
  const std::size_t e = s.find('e');
  *exp = std::stoi(s.substr(e + 1));
  digits->clear();
  for (std::size_t i = 0; i < e; ++i) {
    if (s[i] != '.') digits->push_back(s[i]);
  }
  while (digits->size() > 1 && digits->back() == '0') digits->pop_back();
}

/// Python's repr of a float (numpy's str of a float scalar): positional for
/// 1e-4 <= |x| < 1e16 ("0.5", "1.0", "123.25"), else scientific ("1e-05",
/// "1.5e+16").
template <class T>
std::string PythonFloatRepr(T x) {
  if (std::isnan(x)) return "nan";
  if (std::isinf(x)) return x < 0 ? "-inf" : "inf";
  const std::string sign = std::signbit(x) ? "-" : "";
  if (x == 0) return sign + "0.0";
  std::string digits;
  int exp = 0;
  ShortestDigits(x, &digits, &exp);
  if (exp < -4 || exp >= 16) {
    std::string out = sign + digits.substr(0, 1);
    if (digits.size() > 1) out += "." + digits.substr(1);
    char e[16];
    std::snprintf(e, sizeof(e), "e%c%02d", exp < 0 ? '-' : '+', std::abs(exp));
    return out + e;
  }
  std::string int_part;
  std::string frac_part;
  if (exp >= 0) {
    const std::size_t n = static_cast<std::size_t>(exp) + 1;
    int_part = digits.substr(0, std::min(n, digits.size()));
    if (int_part.size() < n) int_part.append(n - int_part.size(), '0');
    if (digits.size() > n) frac_part = digits.substr(n);
  } else {
    int_part = "0";
    frac_part = std::string(static_cast<std::size_t>(-exp - 1), '0') + digits;
  }
  return sign + int_part + "." + (frac_part.empty() ? "0" : frac_part);
}

/// Python's repr of bytes: b'...' (b"..." when it holds ' but no ").
std::string PythonBytesRepr(const std::string& s) {
  const bool dquote = s.find('\'') != std::string::npos && s.find('"') == std::string::npos;
  const char quote = dquote ? '"' : '\'';
  std::string out = "b";
  out.push_back(quote);
  for (const unsigned char c : s) {
    if (c == quote || c == '\\') {
      out.push_back('\\');
      out.push_back(static_cast<char>(c));
    } else if (c == '\t') {
      out += "\\t";
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c < 0x20 || c >= 0x7f) {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\x%02x", c);
      out += buf;
    } else {
      out.push_back(static_cast<char>(c));
    }
  }
  out.push_back(quote);
  return out;
}

std::string StripTrailingZeros(std::string s) {
  while (!s.empty() && s.back() == '0') s.pop_back();
  return s;
}

/// numpy's FloatingFormat for the elements of one array (floatmode
/// "maxprec", precision 8, suppress=True): a common layout for the shown
/// elements, then each element in it.
class FloatArrayFormat {
 public:
  explicit FloatArrayFormat(const std::vector<double>& shown, bool is_float32) : is_float32_(is_float32) {
    double max_abs = 0;
    bool any_finite = false;
    bool negative_inf = false;
    for (const double v : shown) {
      if (std::isfinite(v)) {
        any_finite = true;
        max_abs = std::max(max_abs, std::fabs(v));
      } else if (std::isinf(v) && v < 0) {
        negative_inf = true;
      }
    }
    exp_format_ = max_abs >= 1e8;
    if (any_finite && exp_format_) {
      for (const double v : shown) {
        if (!std::isfinite(v)) continue;
        const Sci s = Scientific(v);
        pad_left_ = std::max(pad_left_, s.int_part.size());
        precision_ = std::max(precision_, s.frac_part.size());
        exp_size_ = std::max(exp_size_, s.exp_digits.size());
      }
      pad_right_ = exp_size_ + 2 + precision_;
    } else if (any_finite) {
      for (const double v : shown) {
        if (!std::isfinite(v)) continue;
        const auto [int_part, frac_part] = Positional(v);
        pad_left_ = std::max(pad_left_, int_part.size());
        pad_right_ = std::max(pad_right_, frac_part.size());
      }
    }
    if (std::any_of(shown.begin(), shown.end(), [](double v) { return !std::isfinite(v); })) {
      const std::size_t offset = pad_right_ + 1;
      const std::size_t inf_len = 3 + (negative_inf ? 1 : 0);
      if (3 > offset) pad_left_ = std::max(pad_left_, 3 - offset);
      if (inf_len > offset) pad_left_ = std::max(pad_left_, inf_len - offset);
    }
  }

  std::string operator()(double v) const {
    if (!std::isfinite(v)) {
      const std::string s = std::isnan(v) ? "nan" : (v < 0 ? "-inf" : "inf");
      return PadLeft(s, pad_left_ + pad_right_ + 1);
    }
    if (exp_format_) {
      // numpy prints the common precision with the value's exact digits past
      // its shortest ones (dragon4's min_digits), as "%.*e" does.
      char buf[64];
      std::snprintf(buf, sizeof(buf), "%.*e", static_cast<int>(precision_), v);
      const std::string s = buf;  // "-1.25e+08"; "1e+08" for precision 0
      const std::size_t e = s.find('e');
      const std::size_t dot = s.find('.');
      const std::string int_part = s.substr(0, std::min(dot, e));
      const std::string frac_part = dot < e ? s.substr(dot + 1, e - dot - 1) : "";
      std::string exp_digits = s.substr(e + 2);
      if (exp_digits.size() < exp_size_) exp_digits.insert(0, exp_size_ - exp_digits.size(), '0');
      return PadLeft(int_part, pad_left_) + "." + frac_part + "e" + s[e + 1] + exp_digits;
    }
    const auto [int_part, frac_part] = Positional(v);
    return PadLeft(int_part, pad_left_) + "." + frac_part + std::string(pad_right_ - frac_part.size(), ' ');
  }

 private:
  struct Sci {
    std::string int_part;   // "-1"
    std::string frac_part;  // "25" (trailing zeros trimmed)
    char exp_sign = '+';
    std::string exp_digits;  // "08"
  };

  static std::string PadLeft(const std::string& s, std::size_t width) {
    return s.size() >= width ? s : std::string(width - s.size(), ' ') + s;
  }

  /// Shortest digits, at most 8 after the point; trailing zeros trimmed, the
  /// point kept ("1." for 1.0). Integer digits are exact: numpy's padded
  /// dragon4 prints float32 83391432 as "83391432.", not "83391430.".
  std::pair<std::string, std::string> Positional(double v) const {
    std::string s = is_float32_ ? PythonFloatRepr(static_cast<float>(v)) : PythonFloatRepr(v);
    std::string int_part;
    std::string frac_part;
    if (s.find('e') != std::string::npos || s.size() - s.find('.') - 1 > 8) {
      char buf[512];
      std::snprintf(buf, sizeof(buf), "%.8f", v);
      s = buf;
    } else if (std::fabs(v) >= 1e7 && s.size() >= 2 && s.compare(s.size() - 2, 2, ".0") == 0) {
      // The shortest digits end before the point (the value is an integer).
      char buf[512];
      std::snprintf(buf, sizeof(buf), "%.0f.", v);
      s = buf;
    }
    const std::size_t dot = s.find('.');
    int_part = s.substr(0, dot);
    frac_part = StripTrailingZeros(s.substr(dot + 1));
    return {int_part, frac_part};
  }

  /// Shortest digits in scientific form, at most 8 after the point.
  Sci Scientific(double v) const {
    Sci out;
    const std::string sign = std::signbit(v) ? "-" : "";
    std::string mantissa;
    int exp = 0;
    if (v == 0) {
      mantissa = "0";
    } else {
      std::string digits;
      if (is_float32_) {
        ShortestDigits(static_cast<float>(v), &digits, &exp);
      } else {
        ShortestDigits(v, &digits, &exp);
      }
      if (digits.size() > 9) {
        char buf[64];
        std::snprintf(buf, sizeof(buf), "%.8e", std::fabs(v));
        const std::string s = buf;  // "1.23456789e+08"
        const std::size_t e = s.find('e');
        exp = std::stoi(s.substr(e + 1));
        digits.clear();
        for (std::size_t i = 0; i < e; ++i) {
          if (s[i] != '.') digits.push_back(s[i]);
        }
        while (digits.size() > 1 && digits.back() == '0') digits.pop_back();
      }
      mantissa = digits;
    }
    out.int_part = sign + mantissa.substr(0, 1);
    out.frac_part = mantissa.substr(1);
    out.exp_sign = exp < 0 ? '-' : '+';
    out.exp_digits = std::to_string(std::abs(exp));
    if (out.exp_digits.size() < 2) out.exp_digits.insert(0, 1, '0');
    return out;
  }

  bool is_float32_;
  bool exp_format_ = false;
  std::size_t pad_left_ = 0;
  std::size_t pad_right_ = 0;
  std::size_t precision_ = 0;
  std::size_t exp_size_ = 0;
};

/// numpy's summarisation: past 1000 elements, 3 items at each edge of every
/// dimension.
constexpr int64_t kSummaryThreshold = 1000;
constexpr int64_t kEdgeItems = 3;
/// numpy's default linewidth.
constexpr std::size_t kLineWidth = 75;

/// numpy's _formatArray: walks `shape` the way it prints, calling
/// `visit(flat_index)` for each shown element and building the text when
/// `element` is given.
class ArrayWalker {
 public:
  ArrayWalker(const TensorShape& shape, bool summarize) : shape_(shape), summarize_(summarize) {}

  std::vector<int64_t> ShownIndices() const {
    std::vector<int64_t> out;
    Collect(0, 0, &out);
    return out;
  }

  std::string Render(const std::function<std::string(int64_t)>& element) const {
    return Recurse(0, 0, " ", kLineWidth, element);
  }

 private:
  int64_t Stride(int axis) const {
    int64_t stride = 1;
    for (int a = axis + 1; a < shape_.rank(); ++a) stride *= shape_.dim(a);
    return stride;
  }

  std::vector<int64_t> Items(int axis) const {
    const int64_t n = shape_.dim(axis);
    std::vector<int64_t> items;
    if (summarize_ && 2 * kEdgeItems < n) {
      for (int64_t i = 0; i < kEdgeItems; ++i) items.push_back(i);
      items.push_back(-1);  // "..."
      for (int64_t i = n - kEdgeItems; i < n; ++i) items.push_back(i);
    } else {
      for (int64_t i = 0; i < n; ++i) items.push_back(i);
    }
    return items;
  }

  void Collect(int axis, int64_t offset, std::vector<int64_t>* out) const {
    if (axis == shape_.rank()) {
      out->push_back(offset);
      return;
    }
    for (const int64_t i : Items(axis)) {
      if (i >= 0) Collect(axis + 1, offset + i * Stride(axis), out);
    }
  }

  /// numpy's _extendLine: starts a new line when `word` would pass
  /// `width`, unless the line holds nothing but the indent.
  static void ExtendLine(std::string* s, std::string* line, const std::string& word, std::size_t width,
                         const std::string& hanging_indent) {
    if (line->size() + word.size() > width && line->size() > hanging_indent.size()) {
      std::string done = *line;
      while (!done.empty() && done.back() == ' ') done.pop_back();
      *s += done + "\n";
      *line = hanging_indent;
    }
    *line += word;
  }

  std::string Recurse(int axis, int64_t offset, const std::string& hanging_indent, std::size_t width,
                      const std::function<std::string(int64_t)>& element) const {
    if (axis == shape_.rank()) return element(offset);
    const std::string next_indent = hanging_indent + " ";
    const int axes_left = shape_.rank() - axis;
    std::vector<std::string> parts;
    for (const int64_t i : Items(axis)) {
      const std::size_t next_width = width > 2 ? width - 1 : 2;
      parts.push_back(i < 0 ? "..." : Recurse(axis + 1, offset + i * Stride(axis), next_indent, next_width, element));
    }
    std::string s;
    if (axes_left == 1) {
      // Elements fill lines of `width` - 1 (room for the closing bracket).
      std::string line = hanging_indent;
      for (std::size_t k = 0; k < parts.size(); ++k) {
        ExtendLine(&s, &line, parts[k], width - 1, hanging_indent);
        if (k + 1 < parts.size()) line += " ";
      }
      s += line;
    } else {
      const std::string line_sep(static_cast<std::size_t>(axes_left - 1), '\n');
      for (std::size_t k = 0; k < parts.size(); ++k) {
        s += hanging_indent + parts[k];
        if (k + 1 < parts.size()) s += line_sep;
      }
    }
    return "[" + s.substr(hanging_indent.size()) + "]";
  }

  const TensorShape& shape_;
  bool summarize_;
};

template <class T>
std::string IntString(T v) {
  return std::to_string(static_cast<int64_t>(v));
}

}  // namespace

std::string FormatTensorForLog(const Tensor& tensor) {
  const DataType dtype = tensor.dtype();
  if (dtype == DataType::kInvalid) return "<invalid tensor>";
  if (tensor.shape().rank() == 0) {
    switch (dtype) {
      case DataType::kFloat: return PythonFloatRepr(*tensor.data<float>());
      case DataType::kDouble: return PythonFloatRepr(*tensor.data<double>());
      case DataType::kInt32: return IntString(*tensor.data<int32_t>());
      case DataType::kUInt8: return IntString(*tensor.data<uint8_t>());
      case DataType::kInt64: return IntString(*tensor.data<int64_t>());
      case DataType::kString: return PythonBytesRepr(*tensor.data<std::string>());
      default: return "<invalid tensor>";
    }
  }
  if (tensor.num_elements() == 0) return "[]";

  const ArrayWalker walker(tensor.shape(), tensor.num_elements() > kSummaryThreshold);
  const std::vector<int64_t> shown = walker.ShownIndices();
  std::function<std::string(int64_t)> element;
  if (dtype == DataType::kFloat || dtype == DataType::kDouble) {
    std::vector<double> values;
    for (const int64_t i : shown) {
      values.push_back(dtype == DataType::kFloat ? static_cast<double>(tensor.data<float>()[i])
                                                 : tensor.data<double>()[i]);
    }
    auto format = std::make_shared<FloatArrayFormat>(values, dtype == DataType::kFloat);
    element = [format, &tensor, dtype](int64_t i) {
      return (*format)(dtype == DataType::kFloat ? static_cast<double>(tensor.data<float>()[i])
                                                 : tensor.data<double>()[i]);
    };
  } else if (dtype == DataType::kString) {
    element = [&tensor](int64_t i) { return PythonBytesRepr(tensor.data<std::string>()[i]); };
  } else {
    const auto int_at = [&tensor, dtype](int64_t i) -> std::string {
      if (dtype == DataType::kInt32) return IntString(tensor.data<int32_t>()[i]);
      if (dtype == DataType::kUInt8) return IntString(tensor.data<uint8_t>()[i]);
      return IntString(tensor.data<int64_t>()[i]);
    };
    std::size_t width = 0;
    for (const int64_t i : shown) width = std::max(width, int_at(i).size());
    element = [int_at, width](int64_t i) {
      const std::string s = int_at(i);
      return std::string(width - s.size(), ' ') + s;
    };
  }
  return walker.Render(element);
}

// -- LoggingTensorHook ------------------------------------------------------------------

StatusOr<std::shared_ptr<LoggingTensorHook>> LoggingTensorHook::Create(LoggingTensorHookOptions options) {
  // B117, TF's messages.
  const bool only_log_at_end = options.at_end && !options.every_n_iter.has_value() && !options.every_n_secs.has_value();
  if (!only_log_at_end && options.every_n_iter.has_value() == options.every_n_secs.has_value()) {
    return absl::InvalidArgumentError(
        "either at_end and/or exactly one of every_n_iter and every_n_secs must be provided.");
  }
  if (options.every_n_iter.has_value() && *options.every_n_iter <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("invalid every_n_iter=", *options.every_n_iter, "."));
  }
  if (options.sorted_tags) std::sort(options.tensors.begin(), options.tensors.end());
  std::optional<SecondOrStepTimer> timer;
  if (!only_log_at_end) {
    FOREMAN_ASSIGN_OR_RETURN(timer, SecondOrStepTimer::Create(options.every_n_secs, options.every_n_iter,
                                                              options.clock));
  }
  return std::shared_ptr<LoggingTensorHook>(new LoggingTensorHook(std::move(options), std::move(timer)));
}

LoggingTensorHook::LoggingTensorHook(LoggingTensorHookOptions options, std::optional<SecondOrStepTimer> timer)
    : options_(std::move(options)), timer_(std::move(timer)) {}

Status LoggingTensorHook::begin() {
  if (timer_.has_value()) timer_->reset();
  iter_count_ = 0;
  return absl::OkStatus();
}

StatusOr<SessionRunArgs> LoggingTensorHook::before_run(SessionRunContext& /*ctx*/) {
  should_trigger_ = timer_.has_value() && timer_->should_trigger_for_step(iter_count_);
  SessionRunArgs args;
  if (should_trigger_) args.fetches = options_.tensors;
  return args;
}

Status LoggingTensorHook::after_run(SessionRunContext& /*ctx*/, const SessionRunValues& values) {
  if (should_trigger_) {
    static const TensorMap kNone;
    FOREMAN_RETURN_IF_ERROR(LogTensors(values.results == nullptr ? kNone : *values.results));
  }
  ++iter_count_;
  return absl::OkStatus();
}

Status LoggingTensorHook::end(Session* session) {
  if (!options_.at_end) return absl::OkStatus();
  TensorMap values;
  if (!options_.tensors.empty()) {
    FOREMAN_ASSIGN_OR_RETURN(values, session->Run(options_.tensors));
  }
  return LogTensors(values);
}

Status LoggingTensorHook::LogTensors(const TensorMap& values) {
  // TF updates the timer even for at_end alone (its NeverTriggerTimer then
  // reports no elapsed time).
  std::optional<std::pair<double, int64_t>> elapsed;
  if (timer_.has_value()) elapsed = timer_->update_last_triggered_step(iter_count_);
  if (options_.formatter) {
    StatusOr<std::string> line = InvokeUserCode("hook LoggingTensorHook formatter",
                                                [&]() -> StatusOr<std::string> { return options_.formatter(values); });
    if (!line.ok()) return line.status();
    FOREMAN_LOG_INFO("{}", *line);
    return absl::OkStatus();
  }
  std::vector<std::string> stats;
  for (const std::string& tag : options_.tensors) {
    const auto it = values.find(tag);
    if (it == values.end()) {
      return absl::InternalError(absl::StrCat("LoggingTensorHook: the run returned no value for \"", tag, "\"."));
    }
    stats.push_back(absl::StrCat(tag, " = ", FormatTensorForLog(it->second)));
  }
  if (elapsed.has_value()) {
    FOREMAN_LOG_INFO("{} ({:.3f} sec)", absl::StrJoin(stats, ", "), elapsed->first);
  } else {
    FOREMAN_LOG_INFO("{}", absl::StrJoin(stats, ", "));
  }
  return absl::OkStatus();
}

// -- NanTensorHook ---------------------------------------------------------------------

StatusOr<SessionRunArgs> NanTensorHook::before_run(SessionRunContext& /*ctx*/) {
  SessionRunArgs args;
  args.fetches = {loss_tensor_};
  return args;
}

Status NanTensorHook::after_run(SessionRunContext& ctx, const SessionRunValues& values) {
  const TensorMap* results = values.results;
  const auto it = results == nullptr ? TensorMap::const_iterator() : results->find(loss_tensor_);
  if (results == nullptr || it == results->end()) {
    return absl::InternalError(absl::StrCat("NanTensorHook: the run returned no value for \"", loss_tensor_, "\"."));
  }
  const Tensor& loss = it->second;
  bool is_nan = false;
  if (loss.num_elements() == 1 && loss.dtype() == DataType::kFloat) {
    is_nan = std::isnan(*loss.data<float>());
  } else if (loss.num_elements() == 1 && loss.dtype() == DataType::kDouble) {
    is_nan = std::isnan(*loss.data<double>());
  } else {
    return absl::InvalidArgumentError(absl::StrCat("NanTensorHook: the loss \"", loss_tensor_,
                                                   "\" must be a float32 or float64 tensor of one element, got ",
                                                   DataTypeName(loss.dtype()), loss.shape().ToString(), "."));
  }
  if (!is_nan) return absl::OkStatus();  // B119: Inf is not divergence
  constexpr char kFailureMessage[] = "Model diverged with loss = NaN.";
  if (fail_on_nan_loss_) {
    FOREMAN_LOG_ERROR("{}", kFailureMessage);
    return NanLossDuringTrainingError("NaN loss during training.");
  }
  FOREMAN_LOG_WARN("{}", kFailureMessage);
  ctx.request_stop();
  return absl::OkStatus();
}

// -- GlobalStepWaiterHook --------------------------------------------------------------

Status GlobalStepWaiterHook::begin() {
  worker_is_started_ = false;
  return absl::OkStatus();
}

Status GlobalStepWaiterHook::after_create_session(Session* session, Coordinator* /*coord*/) {
  return internal::RequireGlobalStep(session, *this);
}

StatusOr<SessionRunArgs> GlobalStepWaiterHook::before_run(SessionRunContext& ctx) {
  if (worker_is_started_) return SessionRunArgs{};
  if (wait_until_step_ <= 0) {
    worker_is_started_ = true;
    return SessionRunArgs{};
  }
  FOREMAN_LOG_INFO("Waiting for global step {} before starting training.", wait_until_step_);
  const absl::Duration start = clock_->MonotonicNow();
  int64_t last_logged_step = 0;
  while (true) {
    FOREMAN_ASSIGN_OR_RETURN(const int64_t current_step, internal::RealGlobalStep(ctx.session(), *this));
    if (current_step >= wait_until_step_) {
      worker_is_started_ = true;
      return SessionRunArgs{};
    }
    if (current_step - last_logged_step > 1000) {
      FOREMAN_LOG_INFO("Waiting for global step {} before starting training. Current step is {}.",
                       wait_until_step_, current_step);
      last_logged_step = current_step;
    }
    absl::Duration sleep = poll_interval_;
    if (max_wait_.has_value()) {
      const absl::Duration left = start + *max_wait_ - clock_->MonotonicNow();
      if (left <= absl::ZeroDuration()) {
        return absl::DeadlineExceededError(
            absl::StrCat("GlobalStepWaiterHook: global_step is ", current_step, " after waiting ",
                         absl::FormatDuration(*max_wait_), " for step ", wait_until_step_, "."));
      }
      sleep = std::min(sleep, left);
    }
    clock_->SleepFor(sleep);
  }
}

// -- FinalOpsHook ------------------------------------------------------------------------

Status FinalOpsHook::end(Session* session) {
  if (final_ops_.empty()) return absl::OkStatus();
  StatusOr<TensorMap> values = session->Run(final_ops_, feeds_);
  if (!values.ok()) {
    if (absl::IsOutOfRange(values.status())) {
      FOREMAN_LOG_WARN(
          "An OutOfRangeError or StopIteration exception is raised by the code in FinalOpsHook. This typically "
          "means the Ops running by the FinalOpsHook have a dependency back to some input source, which should "
          "not happen. For example, for metrics in tf.estimator.Estimator, all metrics functions return two "
          "Ops: `value_op` and  `update_op`. Estimator.evaluate calls the `update_op` for each batch, but only "
          "calls the `value_op` once at the end of the evaluation. And only `value_op` should be passed to "
          "FinalOpsHook. If `update_op` is passed to FinalOpsHook, this might cause the OutOfRangeError or "
          "StopIteration exception.");
    }
    return values.status();
  }
  values_ = *std::move(values);
  return absl::OkStatus();
}

// -- FeedFnHook ---------------------------------------------------------------------------

StatusOr<SessionRunArgs> FeedFnHook::before_run(SessionRunContext& /*ctx*/) {
  if (!feed_fn_) return absl::InvalidArgumentError("FeedFnHook: feed_fn is empty.");
  StatusOr<TensorMap> feeds =
      InvokeUserCode("hook FeedFnHook feed_fn", [this]() -> StatusOr<TensorMap> { return feed_fn_(); });
  if (!feeds.ok()) return feeds.status();
  SessionRunArgs args;
  args.feeds = *std::move(feeds);
  return args;
}

// -- ProfilerHook ------------------------------------------------------------------------

StatusOr<std::shared_ptr<ProfilerHook>> ProfilerHook::Create(ProfilerHookOptions options) {
  if (options.env == nullptr) options.env = Env::Default();
  if (options.clock == nullptr) options.clock = Clock::Real();
  FOREMAN_ASSIGN_OR_RETURN(SecondOrStepTimer timer,
                           SecondOrStepTimer::Create(options.save_secs, options.save_steps, options.clock));
  return std::shared_ptr<ProfilerHook>(new ProfilerHook(std::move(options), std::move(timer)));
}

ProfilerHook::ProfilerHook(ProfilerHookOptions options, SecondOrStepTimer timer)
    : options_(std::move(options)), timer_(std::move(timer)) {}

Status ProfilerHook::begin() {
  next_step_.reset();
  // TF's SummaryWriterCache.get(output_dir) creates the directory.
  if (!options_.output_dir.empty()) {
    FOREMAN_RETURN_IF_ERROR(options_.env->RecursivelyCreateDir(options_.output_dir));
  }
  return absl::OkStatus();
}

Status ProfilerHook::after_create_session(Session* session, Coordinator* /*coord*/) {
  return internal::RequireGlobalStep(session, *this);
}

StatusOr<SessionRunArgs> ProfilerHook::before_run(SessionRunContext& /*ctx*/) {
  request_summary_ = next_step_.has_value() && timer_.should_trigger_for_step(*next_step_);
  SessionRunArgs args;
  args.fetches = {"global_step"};
  if (request_summary_) args.options.trace_level = RunOptions::kFullTrace;
  return args;
}

Status ProfilerHook::after_run(SessionRunContext& ctx, const SessionRunValues& values) {
  FOREMAN_ASSIGN_OR_RETURN(const int64_t stale_global_step, internal::StaleGlobalStep(values, *this));
  // The first run only primes the timer: nothing is traced until N steps or
  // seconds have passed.
  if (!next_step_.has_value()) timer_.update_last_triggered_step(stale_global_step);
  int64_t global_step = stale_global_step + 1;
  if (request_summary_) {
    FOREMAN_ASSIGN_OR_RETURN(global_step, internal::RealGlobalStep(ctx.session(), *this));
    timer_.update_last_triggered_step(global_step);
    const std::string path = JoinPath(options_.output_dir, absl::StrCat("timeline-", global_step, ".json"));
    FOREMAN_LOG_INFO("Saving timeline for {} into '{}'.", global_step, path);
    static const RunMetadata kEmpty;
    const RunMetadata& metadata = values.run_metadata == nullptr ? kEmpty : *values.run_metadata;
    FOREMAN_RETURN_IF_ERROR(
        Annotate(WriteStringToFile(options_.env, path, ChromeTraceJson(metadata, global_step)), "ProfilerHook"));
  }
  next_step_ = global_step + 1;
  return absl::OkStatus();
}

namespace {

/// A JSON string literal of `s` (UTF-8 passes through unchanged).
std::string JsonString(const std::string& s) {
  std::string out = "\"";
  for (const unsigned char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      default:
        if (c < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof(buf), "\\u%04x", c);
          out += buf;
        } else {
          out.push_back(static_cast<char>(c));
        }
    }
  }
  out += "\"";
  return out;
}

}  // namespace

std::string ChromeTraceJson(const RunMetadata& metadata, int64_t step) {
  std::vector<int64_t> thread_ids;  // original ids, in order of first appearance
  std::unordered_map<int64_t, std::size_t> tid_of;
  for (const TraceEvent& e : metadata.step_stats) {
    if (tid_of.emplace(e.thread_id, thread_ids.size()).second) thread_ids.push_back(e.thread_id);
  }
  std::vector<std::string> events;
  events.push_back(absl::StrCat(R"({"name":"process_name","ph":"M","pid":0,"args":{"name":)",
                                JsonString(absl::StrCat("Foreman step ", step)), "}}"));
  for (std::size_t t = 0; t < thread_ids.size(); ++t) {
    events.push_back(absl::StrCat(R"({"name":"thread_name","ph":"M","pid":0,"tid":)", t, R"(,"args":{"name":)",
                                  JsonString(absl::StrCat("thread ", t)), "}}"));
  }
  for (const TraceEvent& e : metadata.step_stats) {
    events.push_back(absl::StrCat(R"({"name":)", JsonString(e.name), R"(,"cat":)", JsonString(e.category),
                                  R"(,"ph":"X","ts":)", e.start_us, R"(,"dur":)", e.duration_us,
                                  R"(,"pid":0,"tid":)", tid_of.at(e.thread_id), "}"));
  }
  return absl::StrCat("{\"traceEvents\":[\n", absl::StrJoin(events, ",\n"), "\n]}\n");
}

}  // namespace foreman
