#include "poseidon/common/at_exit.h"

#include <pthread.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <mutex>
#include <utility>
#include <vector>

namespace poseidon {
namespace {

struct Registration {
  const void* key;
  std::function<void()> leave;
};

struct Registry {
  // Recursive: a leave may withdraw itself (its owner's teardown) while the handler holds the lock.
  std::recursive_mutex mutex;
  std::vector<Registration> leaves;  // oldest first; guarded by mutex
};

// Never destroyed: static objects are torn down around exit handlers, and this one must outlive
// them all (a leave may run from the handler while another static's destructor withdraws). A forked
// child starts a fresh one: the parent's leaves are not its own (their threads did not come along), and
// the parent's lock may have been held by a thread that the child does not have.
std::atomic<Registry*> gRegistry{nullptr};

Registry& registry() {
  static const bool made = (gRegistry = new Registry, true);
  (void)made;
  return *gRegistry.load();
}

void inForkedChild() { gRegistry = new Registry; }

void erase(Registry& r, const void* key) {
  r.leaves.erase(std::remove_if(r.leaves.begin(), r.leaves.end(), [key](const Registration& g) { return g.key == key; }),
                 r.leaves.end());
}

void runLeaves() {
  Registry& r = registry();
  // Held while the leaves run: a destructor on another thread that withdraws one waits for it, then
  // finds it gone. Taken out of the list first, so that a leave's own withdrawal finds nothing.
  std::lock_guard<std::recursive_mutex> lock(r.mutex);
  std::vector<Registration> leaves;
  leaves.swap(r.leaves);
  for (auto it = leaves.rbegin(); it != leaves.rend(); ++it) {  // newest first, as destructors go
    try {
      it->leave();
    } catch (...) {
      // Best effort: the process is ending whatever a leave throws.
    }
  }
}

}  // namespace

void leaveAtExit(const void* key, std::function<void()> leave) {
  Registry& r = registry();
  static std::once_flag installed;
  std::call_once(installed, [] {
    ::pthread_atfork(nullptr, nullptr, inForkedChild);
    std::atexit(runLeaves);
  });
  std::lock_guard<std::recursive_mutex> lock(r.mutex);
  erase(r, key);
  r.leaves.push_back(Registration{key, std::move(leave)});
}

void withdrawLeaveAtExit(const void* key) {
  Registry& r = registry();
  std::lock_guard<std::recursive_mutex> lock(r.mutex);
  erase(r, key);
}

}  // namespace poseidon
