#include "poseidon/common/thread_pool.h"

#include "poseidon/common/error.h"

namespace poseidon {

ThreadPool::ThreadPool(int threads) {
  if (threads < 1) throw InvalidArgument(strCat("thread pool needs at least 1 thread, got ", threads));
  threads_.reserve(threads);
  for (int i = 0; i < threads; ++i) threads_.emplace_back([this] { run(); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  cv_.notify_all();
  for (auto& t : threads_) t.join();
}

void ThreadPool::schedule(std::function<void()> task) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    queue_.push_back(std::move(task));
  }
  cv_.notify_one();
}

void ThreadPool::run() {
  for (;;) {
    std::function<void()> task;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      cv_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping and drained
      task = std::move(queue_.front());
      queue_.pop_front();
      ++running_;
    }
    task();
    task = nullptr;  // whatever it captured is released before the pool reports idle
    {
      std::lock_guard<std::mutex> lock(mutex_);
      --running_;
      if (running_ > 0 || !queue_.empty()) continue;
    }
    idle_.notify_all();
  }
}

void ThreadPool::waitIdle() {
  std::unique_lock<std::mutex> lock(mutex_);
  idle_.wait(lock, [this] { return queue_.empty() && running_ == 0; });
}

}  // namespace poseidon
