// The emulated cluster as the bench tests see it (bench_smoke_test.cc, bench_lifecycle_test.cc): the
// network namespaces a harness made, what runs in them, and a skip where none can be made.
#pragma once

#include <gtest/gtest.h>
#include <sys/types.h>

#include <cctype>
#include <cstdio>
#include <string>
#include <vector>

#include "poseidon/bench/cluster.h"

namespace poseidon::testing {

// The namespaces of the harness with process id `pid` (psd<pid>n0, ..., psd<pid>sw).
inline std::vector<std::string> namespacesOf(pid_t pid) {
  std::vector<std::string> out;
  for (const auto& ns : bench::EmulatedCluster::listOurNamespaces())
    if (ns.rfind("psd" + std::to_string(pid), 0) == 0 && !std::isdigit(ns[3 + std::to_string(pid).size()])) out.push_back(ns);
  return out;
}

// Processes running inside a network namespace.
inline std::string pidsIn(const std::string& ns) {
  std::string out;
  FILE* f = popen(("ip netns pids " + ns + " 2>/dev/null").c_str(), "r");
  if (!f) return out;
  char buf[256];
  while (fgets(buf, sizeof buf, f)) out += buf;
  pclose(f);
  return out;
}

}  // namespace poseidon::testing

// Skips the test that says it where no emulated cluster can be made here (not root, no ip or tc). A
// macro, not a function: GTEST_SKIP returns from the function it is in, which must be the test.
#define POSEIDON_REQUIRE_CLUSTER()                                                                      \
  do {                                                                                                  \
    std::string poseidonWhyNoCluster;                                                                   \
    if (!::poseidon::bench::EmulatedCluster::available(&poseidonWhyNoCluster))                          \
      GTEST_SKIP() << "no emulated cluster here: " << poseidonWhyNoCluster;                             \
  } while (0)
