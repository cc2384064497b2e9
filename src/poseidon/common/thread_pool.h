// Fixed-size CPU thread pool for the syncers (paper Algorithm 2:
// thread_pool.Schedule(sync(l))). Tasks run in FIFO order so that syncs
// scheduled during backward start in backward order (top layer first).
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace poseidon {

class ThreadPool {
 public:
  explicit ThreadPool(int threads);
  ~ThreadPool();  // drains queued tasks, then joins
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  // Tasks must not throw; they report failure through their owner's status.
  void schedule(std::function<void()> task);
  // Waits until no task is queued or running. Never call it from a task.
  void waitIdle();
  int size() const { return static_cast<int>(threads_.size()); }

 private:
  void run();
  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> queue_;  // guarded by mutex_
  bool stopping_ = false;                    // guarded by mutex_
  int running_ = 0;                          // guarded by mutex_
  std::condition_variable idle_;
  std::vector<std::thread> threads_;
};

}  // namespace poseidon
