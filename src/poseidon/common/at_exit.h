// Work that must run when the process exits with something of ours still running: exit() called
// mid-training, or main returning while a Node lives on (leaked, or owned by a static object).
// Neither destroys the Node, so without this its peers hear nothing until the liveness timeout (30 s
// by default) and then say "lost rank R ... it died, hung or became unreachable", which is not what
// happened. The node registers its leave (tell the peers why, flush, close) here while it runs and
// withdraws it when it is destroyed; the handler runs every leave still registered at exit.
//
// What this cannot catch: _exit(), quick_exit() and abort() run no exit handlers, and a fatal signal
// none either: those still show as a lost rank after the timeout. A child made by fork() starts with no
// registrations (pthread_atfork): it inherits its parent's nodes but not the threads they need.
#pragma once

#include <functional>

namespace poseidon {

// Runs `leave` at exit unless withdrawn first; the newest run first, as destructors go, and one that
// throws does not stop the others. `key` names the registration (the owner's address): registering
// it again replaces its leave. Thread-safe; the first call installs the exit handler (std::atexit).
void leaveAtExit(const void* key, std::function<void()> leave);
// Withdraws the registration, if any. If the handler is running this key's leave, this waits for it.
void withdrawLeaveAtExit(const void* key);

}  // namespace poseidon
