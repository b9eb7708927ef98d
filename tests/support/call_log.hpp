// CallLog: the calls fake hooks, creators and listeners make, in order
// ("a.begin", "creator.create_session", ...), shared by the session tests.
#pragma once

#include <algorithm>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

namespace foreman::testing {

/// Thread-safe: hooks log from the training thread, tests read from theirs.
class CallLog {
 public:
  void Add(std::string call) {
    std::lock_guard<std::mutex> l(mu_);
    calls_.push_back(std::move(call));
  }
  std::vector<std::string> calls() const {
    std::lock_guard<std::mutex> l(mu_);
    return calls_;
  }
  int Count(const std::string& call) const {
    std::lock_guard<std::mutex> l(mu_);
    return static_cast<int>(std::count(calls_.begin(), calls_.end(), call));
  }
  // The calls whose name ends with `suffix` (".before_run"), in order.
  std::vector<std::string> Ending(const std::string& suffix) const {
    std::vector<std::string> out;
    for (const auto& c : calls()) {
      if (c.size() >= suffix.size() && c.compare(c.size() - suffix.size(), suffix.size(), suffix) == 0) {
        out.push_back(c);
      }
    }
    return out;
  }

 private:
  mutable std::mutex mu_;
  std::vector<std::string> calls_;
};

}  // namespace foreman::testing
