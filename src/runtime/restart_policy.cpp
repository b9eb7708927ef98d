// RestartPolicy helpers (include/foreman/restart_policy.hpp): validation,
// back-off, and the policy's text form (ParseRestartPolicy, RestartPolicyText;
// `foreman train --restart-policy`). The policy is applied by the
// session_supervisor actor (actors/session_supervisor.cpp).
#include "foreman/restart_policy.hpp"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "foreman/fault.hpp"

namespace foreman {

namespace {
constexpr const char* kServiceKinds[] = {"summary_writer", "checkpoint_saver", "step_counter", "input_pipeline"};
}  // namespace

const char* RestartTypeName(RestartType type) {
  switch (type) {
    case RestartType::kPermanent:
      return "permanent";
    case RestartType::kTransient:
      return "transient";
    case RestartType::kTemporary:
      return "temporary";
  }
  return "unknown";
}

const char* RestartStrategyName(RestartStrategy strategy) {
  switch (strategy) {
    case RestartStrategy::kOneForOne:
      return "one_for_one";
    case RestartStrategy::kOneForAll:
      return "one_for_all";
    case RestartStrategy::kRestForOne:
      return "rest_for_one";
  }
  return "unknown";
}

RestartType RestartPolicy::TypeOf(absl::string_view service) const {
  auto it = services.find(std::string(service));
  return it == services.end() ? type : it->second;
}

Status ValidateRestartPolicy(const RestartPolicy& policy) {
  auto bad = [](const std::string& what) { return absl::InvalidArgumentError(absl::StrCat("RestartPolicy: ", what)); };
  auto valid_type = [](RestartType t) {
    return static_cast<int>(t) >= 0 && static_cast<int>(t) <= static_cast<int>(RestartType::kTemporary);
  };
  if (!valid_type(policy.type)) return bad(absl::StrCat("type out of range: ", static_cast<int>(policy.type)));
  for (const auto& [name, type] : policy.services) {
    if (std::find(std::begin(kServiceKinds), std::end(kServiceKinds), name) == std::end(kServiceKinds)) {
      return bad(absl::StrCat("services: unknown service \"", name,
                              "\" (expected summary_writer, checkpoint_saver, step_counter or input_pipeline)"));
    }
    if (!valid_type(type)) return bad(absl::StrCat("services[", name, "]: type out of range: ", static_cast<int>(type)));
  }
  const int strategy = static_cast<int>(policy.strategy);
  if (strategy < 0 || strategy > static_cast<int>(RestartStrategy::kRestForOne)) {
    return bad(absl::StrCat("strategy out of range: ", strategy));
  }
  if (policy.max_restarts < 0) return bad(absl::StrCat("max_restarts must be >= 0, got ", policy.max_restarts));
  if (policy.max_restarts > 0 && policy.period <= absl::ZeroDuration()) {
    return bad(absl::StrCat("period must be > 0 when max_restarts > 0, got ", absl::FormatDuration(policy.period)));
  }
  if (policy.initial_backoff < absl::ZeroDuration() || policy.max_backoff < absl::ZeroDuration()) {
    return bad(absl::StrCat("back-off must be >= 0, got initial_backoff ", absl::FormatDuration(policy.initial_backoff),
                            ", max_backoff ", absl::FormatDuration(policy.max_backoff)));
  }
  if (policy.initial_backoff > policy.max_backoff) {
    return bad(absl::StrCat("initial_backoff ", absl::FormatDuration(policy.initial_backoff), " exceeds max_backoff ",
                            absl::FormatDuration(policy.max_backoff)));
  }
  if (policy.max_backoff > kMaxRestartBackoff) {
    return bad(absl::StrCat("max_backoff must be <= ", absl::FormatDuration(kMaxRestartBackoff), ", got ",
                            absl::FormatDuration(policy.max_backoff)));
  }
  return absl::OkStatus();
}

absl::Duration RestartBackoff(const RestartPolicy& policy, const std::string& service, int64_t restart) {
  if (policy.initial_backoff <= absl::ZeroDuration() || restart < 1) return absl::ZeroDuration();
  absl::Duration base = policy.initial_backoff;
  for (int64_t k = 1; k < restart && base < policy.max_backoff; ++k) base *= 2;
  base = std::min(base, policy.max_backoff);
  const double jitter = 0.5 + FaultDraw(policy.seed, "restart", service, EnvOp::kAny, restart);
  return base * jitter;
}

StatusOr<RestartPolicy> ParseRestartPolicy(const std::string& text) {
  RestartPolicy policy;
  auto bad = [&](std::size_t index, absl::string_view part, const std::string& why) {
    return absl::InvalidArgumentError(absl::StrCat("--restart-policy \"", absl::CHexEscape(text), "\": part ", index + 1, " \"",
                              absl::CHexEscape(part), "\": ", why));
  };
  if (absl::StripAsciiWhitespace(text).empty()) {
    return absl::InvalidArgumentError("--restart-policy must not be empty (leave it out for TF's default)");
  }
  auto parse_type = [](absl::string_view word) -> std::optional<RestartType> {
    for (RestartType t : {RestartType::kPermanent, RestartType::kTransient, RestartType::kTemporary}) {
      if (word == RestartTypeName(t)) return t;
    }
    return std::nullopt;
  };
  // Decimal digits only: no sign, no base prefix, no exponent, no spaces.
  auto all_digits = [](absl::string_view v) {
    return !v.empty() && std::all_of(v.begin(), v.end(), [](char c) { return c >= '0' && c <= '9'; });
  };
  std::set<std::string> seen;
  std::map<std::string, std::size_t> where;  // key -> part index
  const std::vector<absl::string_view> parts = absl::StrSplit(text, ',');
  for (std::size_t i = 0; i < parts.size(); ++i) {
    const absl::string_view part = parts[i];
    if (part.empty()) return bad(i, part, "empty");
    if (std::any_of(part.begin(), part.end(), [](char c) { return absl::ascii_isspace(static_cast<unsigned char>(c)); })) {
      return bad(i, part, "whitespace is not allowed (write e.g. \"one_for_one,max_restarts=3\")");
    }
    const std::size_t eq = part.find('=');
    if (eq == absl::string_view::npos) {
      std::optional<RestartStrategy> strategy;
      for (RestartStrategy st : {RestartStrategy::kOneForOne, RestartStrategy::kOneForAll, RestartStrategy::kRestForOne}) {
        if (part == RestartStrategyName(st)) strategy = st;
      }
      if (strategy) {
        if (!seen.insert("strategy").second) return bad(i, part, "a second strategy");
        policy.strategy = *strategy;
        continue;
      }
      if (auto type = parse_type(part)) {
        if (!seen.insert("type").second) return bad(i, part, "a second default restart type");
        policy.type = *type;
        continue;
      }
      return bad(i, part,
                 "expected a strategy (one_for_one, one_for_all, rest_for_one), a restart type (permanent, transient, "
                 "temporary) or key=value");
    }
    const std::string key(part.substr(0, eq));
    const std::string value(part.substr(eq + 1));
    if (key.empty()) return bad(i, part, "no key before '='");
    if (!seen.insert(key).second) return bad(i, part, absl::StrCat(key, " given twice"));
    where[key] = i;
    auto integer = [&](int64_t min, int64_t max) -> std::optional<int64_t> {
      int64_t v = 0;
      if (!all_digits(value) || value.size() > 18 || !absl::SimpleAtoi(value, &v) || v < min || v > max) {
        return std::nullopt;
      }
      return v;
    };
    if (key == "max_restarts") {
      auto v = integer(0, 1000000);
      if (!v) return bad(i, part, "max_restarts must be an integer in [0, 1000000] (decimal digits)");
      policy.max_restarts = static_cast<int>(*v);
    } else if (key == "period_secs") {
      // A positive decimal with at most millisecond resolution: digits,
      // optionally '.' and 1-3 digits (no sign, exponent, inf or nan).
      const std::size_t dot = value.find('.');
      const absl::string_view whole = absl::string_view(value).substr(0, dot);
      const absl::string_view frac =
          dot == std::string::npos ? absl::string_view() : absl::string_view(value).substr(dot + 1);
      int64_t secs = 0;
      int64_t ms = 0;
      const bool ok = all_digits(whole) && whole.size() <= 10 && absl::SimpleAtoi(whole, &secs) &&
                      (dot == std::string::npos || (all_digits(frac) && frac.size() <= 3));
      if (ok && !frac.empty()) {
        (void)absl::SimpleAtoi(frac, &ms);
        for (std::size_t k = frac.size(); k < 3; ++k) ms *= 10;
      }
      if (!ok || secs > 1000000000 || (secs == 0 && ms == 0)) {
        return bad(i, part,
                   "period_secs must be a positive decimal number of seconds, at most 1000000000, with at most 3 "
                   "decimals (millisecond resolution), e.g. 60 or 0.5");
      }
      policy.period = absl::Seconds(secs) + absl::Milliseconds(ms);
    } else if (key == "initial_backoff_ms" || key == "max_backoff_ms") {
      auto v = integer(0, absl::ToInt64Milliseconds(kMaxRestartBackoff));
      if (!v) {
        return bad(i, part, absl::StrCat(key, " must be an integer number of milliseconds in [0, ",
                                         absl::ToInt64Milliseconds(kMaxRestartBackoff), "] (decimal digits)"));
      }
      (key == "initial_backoff_ms" ? policy.initial_backoff : policy.max_backoff) = absl::Milliseconds(*v);
    } else if (key == "seed") {
      uint64_t v = 0;
      if (!all_digits(value) || !absl::SimpleAtoi(value, &v)) {
        return bad(i, part, "seed must be a non-negative 64-bit integer (decimal digits)");
      }
      policy.seed = v;
    } else {
      // A service kind's type: the kind must be known, then the value a type.
      RestartPolicy one;
      one.services[key] = RestartType::kPermanent;
      if (Status s = ValidateRestartPolicy(one); !s.ok()) {
        if (parse_type(value)) return bad(i, part, std::string(s.message()));
        return bad(i, part,
                   absl::StrCat("unknown key \"", absl::CHexEscape(key),
                                "\" (max_restarts, period_secs, initial_backoff_ms, max_backoff_ms, seed) or a "
                                "service's restart type (summary_writer, checkpoint_saver, step_counter, "
                                "input_pipeline = permanent, transient, temporary)"));
      }
      auto type = parse_type(value);
      if (!type) {
        return bad(i, part,
                   absl::StrCat("bad restart type \"", absl::CHexEscape(value), "\" for ", key,
                                " (expected permanent, transient or temporary)"));
      }
      policy.services[key] = *type;
    }
  }
  if (policy.initial_backoff > policy.max_backoff) {
    // Name the part that set the larger one (the other may be a default).
    const bool initial_given = where.count("initial_backoff_ms") != 0;
    const std::string key = initial_given ? "initial_backoff_ms" : "max_backoff_ms";
    const std::size_t i = where.at(key);
    return bad(i, parts[i],
               absl::StrCat("initial_backoff_ms (", absl::ToInt64Milliseconds(policy.initial_backoff),
                            ") must not exceed max_backoff_ms (", absl::ToInt64Milliseconds(policy.max_backoff),
                            where.count("max_backoff_ms") != 0 ? ")" : ", the default)"));
  }
  if (Status s = ValidateRestartPolicy(policy); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("--restart-policy \"", absl::CHexEscape(text), "\": ", s.message()));
  }
  return policy;
}

std::string RestartPolicyText(const RestartPolicy& p) {
  std::string out = absl::StrCat(RestartStrategyName(p.strategy), ",", RestartTypeName(p.type));
  for (const auto& [kind, type] : p.services) absl::StrAppend(&out, ",", kind, "=", RestartTypeName(type));
  absl::StrAppend(&out, ",max_restarts=", p.max_restarts, ",period_secs=", absl::ToDoubleSeconds(p.period),
                  ",initial_backoff_ms=", absl::ToInt64Milliseconds(p.initial_backoff),
                  ",max_backoff_ms=", absl::ToInt64Milliseconds(p.max_backoff), ",seed=", p.seed);
  return out;
}

}  // namespace foreman
