// Where a rank learns who it is: the launch conventions users already have.
//
//   torchrun / poseidon launch : RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT
//   mpirun (Open MPI)          : OMPI_COMM_WORLD_RANK, OMPI_COMM_WORLD_SIZE, OMPI_COMM_WORLD_LOCAL_RANK
//   Slurm (srun)               : SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID (with SLURM_STEP_ID)
//
// MASTER_ADDR (and optionally MASTER_PORT) must be set for a world of more than one rank so every
// rank finds the coordinator: torchrun and poseidon launch set it, with mpirun and Slurm the user
// exports it. This is the config layer: the only place that reads these variables.
//
// Slurm sets SLURM_PROCID (0) and SLURM_NTASKS in a batch script and an salloc shell as well, where
// the process is not one of the job's tasks: only srun's tasks have SLURM_STEP_ID. Taken as rank 0 of
// SLURM_NTASKS, such a process would wait for ranks that never start; it is its own world instead,
// and RankEnv::notice says why.
#pragma once

#include <functional>
#include <map>
#include <string>
#include <vector>

#include "poseidon/transport/security_mode.h"

namespace poseidon {

constexpr int kDefaultMasterPort = 29500;

struct RankEnv {
  bool present = false;   // some convention set the rank
  // "torchrun", "mpirun", "slurm" or "" when absent; for torchrun's variables set by poseidon's own
  // launcher, its name from POSEIDON_LAUNCHER ("poseidon launch", "poseidon train").
  std::string source;
  int rank = 0;
  int worldSize = 1;
  int localRank = 0;
  std::string masterAddr = "127.0.0.1";
  int masterPort = kDefaultMasterPort;
  bool masterPortSet = false;  // MASTER_PORT was given (else the default)
  // The variables that set the rank and world, as a user would grep for them ("RANK=1 WORLD_SIZE=2");
  // "" when absent. Errors about the world name them.
  std::string origin;
  // Set when a launcher's variables were seen but not taken (a Slurm batch step): one line for the
  // user, said once per process by the no-argument rankFromEnvironment().
  std::string notice;
};

using GetEnv = std::function<const char*(const char*)>;

// The ranks on this host (LOCAL_WORLD_SIZE, set by poseidon launch, train --workers and torchrun);
// 1 when unset or empty. Throws InvalidArgument for a malformed value, naming it.
int localWorldSizeFromEnvironment();

// Throws InvalidArgument for malformed or inconsistent values (a rank outside
// the world, a non-numeric WORLD_SIZE, a missing MASTER_ADDR for a world of more than one).
RankEnv rankFromEnvironment(const GetEnv& getenv);
// This process's environment; the first call prints RankEnv::notice, if any, to stderr.
RankEnv rankFromEnvironment();

// The job secret: POSEIDON_SECRET, else the contents of POSEIDON_SECRET_FILE
// (trailing newline removed), else "". Throws InvalidArgument when the file
// cannot be read or is empty.
std::string jobSecretFromEnvironment(const GetEnv& getenv);
std::string jobSecretFromEnvironment();

// POSEIDON_TRANSPORT_SECURITY (curve | none; `poseidon launch --transport-security` sets it for its
// ranks), else curve. Throws InvalidArgument for another value.
TransportSecurity transportSecurityFromEnvironment(const GetEnv& getenv);
TransportSecurity transportSecurityFromEnvironment();

// Resolves a host name to an IPv4 address string (ZeroMQ binds need one).
std::string resolveHost(const std::string& host);
// The local address this machine would use to reach `ip` (no packet is sent):
// the interface a node should bind its data endpoint to.
std::string localAddressToward(const std::string& ip);
// Finds a free TCP port on `host`: one below the kernel's ephemeral range
// (net.ipv4.ip_local_port_range) that binds now, tried in a random order; if none does, the
// kernel's choice (bind port 0). Why below the range: the port is bound later by its user (a
// coordinator, a rank), and in between any outgoing connection or port-0 bind on the machine may
// take a port of the ephemeral range (a CI run with tests in parallel met "Address already in use").
// Throws IoError with ZeroMQ's reason when no port binds at all (`host` is not this machine's).
int freePort(const std::string& host);

// The running executable's absolute path (/proc/self/exe resolved); throws IoError.
std::string selfExecutable();

// This process's environment with `overrides` set (added or replaced), as NAME=VALUE strings
// for execve: what every child the launchers and the bench start gets.
std::vector<std::string> environmentWith(const std::map<std::string, std::string>& overrides);

}  // namespace poseidon
