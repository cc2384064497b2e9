#include "poseidon/common/trace.h"

#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>

#include "poseidon/common/error.h"
#include "poseidon/common/file.h"

namespace poseidon {

void Tracer::span(const std::string& name, const std::string& category, int lane, int64_t startUs, int64_t endUs,
                  int64_t iteration) {
  std::lock_guard<std::mutex> lock(mutex_);
  events_.push_back({name, category, lane, startUs, endUs, iteration});
}


std::string Tracer::json() const {
  // Lane 3: a device model's copies to the host (torch/device_staging.h), from queueing to done.
  // Lane 4: a KV shard's sums, from a pair's first push in to its aggregate out (client/node.cc).
  static const char* kLanes[] = {"compute (forward/backward/apply)", "send", "receive", "device copies", "shard"};
  nlohmann::json events = nlohmann::json::array();
  events.push_back({{"name", "process_name"}, {"ph", "M"}, {"pid", pid_}, {"args", {{"name", "rank " + std::to_string(pid_)}}}});
  for (int lane = 0; lane < 5; ++lane) {
    events.push_back({{"name", "thread_name"}, {"ph", "M"}, {"pid", pid_}, {"tid", lane}, {"args", {{"name", kLanes[lane]}}}});
  }
  std::lock_guard<std::mutex> lock(mutex_);
  for (const auto& e : events_) {
    nlohmann::json j{{"name", e.name}, {"cat", e.category}, {"ph", "X"}, {"pid", pid_}, {"tid", e.lane},
                     {"ts", e.start}, {"dur", std::max<int64_t>(e.end - e.start, 0)}};
    if (e.iteration >= 0) j["args"] = {{"iteration", e.iteration}};
    events.push_back(std::move(j));
  }
  return nlohmann::json{{"traceEvents", events}, {"displayTimeUnit", "ms"}}.dump();
}

void Tracer::writeFile(const std::string& path) const { writeFileAtomically(path, json(), "trace file"); }

void Tracer::merge(const std::vector<std::string>& inputs, const std::string& output) {
  nlohmann::json all = nlohmann::json::array();
  for (const auto& in : inputs) {
    std::ifstream f(in);
    if (!f) throw IoError("cannot read trace file " + in);
    nlohmann::json j = nlohmann::json::parse(f, nullptr, false);
    if (j.is_discarded() || !j.contains("traceEvents")) throw IoError("trace file " + in + " is not a Chrome trace");
    for (auto& e : j["traceEvents"]) all.push_back(std::move(e));
  }
  std::ofstream f(output);
  if (!f) throw IoError("cannot write trace file " + output);
  f << nlohmann::json{{"traceEvents", all}, {"displayTimeUnit", "ms"}}.dump();
}

}  // namespace poseidon
