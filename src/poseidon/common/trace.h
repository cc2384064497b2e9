// Chrome trace recorder (chrome://tracing, Perfetto): complete events ("X")
// with a process id (the rank) and a thread lane. Spans are buffered in
// memory and written once at the end; recording is one mutex-guarded
// push_back, cheap next to a layer's sync. Timestamps are microseconds of the
// system clock, so traces of several processes on one machine line up.
#pragma once

#include <chrono>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

namespace poseidon {

class Tracer {
 public:
  explicit Tracer(int pid) : pid_(pid) {}
  static int64_t nowMicros() {
    return std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::system_clock::now().time_since_epoch())
        .count();
  }
  // Lanes: 0 = the training thread (forward/backward/apply), 1 = send, 2 = receive, 3 = device copies,
  // 4 = a KV shard's sums.
  void span(const std::string& name, const std::string& category, int lane, int64_t startUs, int64_t endUs,
            int64_t iteration = -1);
  // {"traceEvents": [...]} with process and lane names.
  std::string json() const;
  void writeFile(const std::string& path) const;  // throws IoError
  // Merges several trace files (one per rank) into one.
  static void merge(const std::vector<std::string>& inputs, const std::string& output);

 private:
  struct Event {
    std::string name, category;
    int lane;
    int64_t start, end, iteration;
  };
  int pid_;
  mutable std::mutex mutex_;
  std::vector<Event> events_;  // guarded by mutex_
};

}  // namespace poseidon
