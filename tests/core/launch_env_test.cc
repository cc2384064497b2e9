// Where a rank's place in the job comes from (launch/env.h): the launchers' variables.
#include <gtest/gtest.h>

#include <map>
#include <string>

#include "expect_error.h"
#include "poseidon/launch/env.h"

namespace poseidon {
namespace {

RankEnv envOf(std::map<std::string, std::string> vars) {
  return rankFromEnvironment([vars](const char* name) -> const char* {
    auto it = vars.find(name);
    return it == vars.end() ? nullptr : it->second.c_str();
  });
}

// What rankFromEnvironment refuses these variables with.
std::string refusal(const std::map<std::string, std::string>& vars) {
  return invalidArgumentMessage([&] { envOf(vars); });
}

// A process on its own is a world of one and its own coordinator: a MASTER_ADDR left in the shell for
// another job does not make it bind on another machine's address. A launched rank takes it.
TEST(LaunchEnv, AProcessOnItsOwnIgnoresAStrayMasterAddr) {
  const RankEnv alone = envOf({{"MASTER_ADDR", "10.0.0.5"}, {"MASTER_PORT", "29511"}});
  EXPECT_FALSE(alone.present);
  EXPECT_EQ(alone.worldSize, 1);
  EXPECT_EQ(alone.masterAddr, "127.0.0.1");
  EXPECT_TRUE(alone.masterPortSet);  // a port it was given is still its port
  EXPECT_EQ(alone.masterPort, 29511);
  const RankEnv launched = envOf({{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "10.0.0.5"}});
  EXPECT_TRUE(launched.present);
  EXPECT_EQ(launched.masterAddr, "10.0.0.5");
  const RankEnv slurm =
      envOf({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "1"}, {"SLURM_STEP_ID", "0"}, {"MASTER_ADDR", "h0"}});
  EXPECT_EQ(slurm.masterAddr, "h0");
}

// Slurm sets SLURM_PROCID and SLURM_NTASKS in the batch script and an salloc shell too; only srun's
// tasks have SLURM_STEP_ID (or the older SLURM_STEPID). Taken as rank 0 of 4, the batch script
// would wait out its timeout for three ranks that never start (and `train --workers 2` there was
// refused as disagreeing with a world of 4); it is a world of its own, and the notice says why.
TEST(LaunchEnv, ASlurmBatchStepIsNotATaskOfTheJob) {
  const RankEnv batch = envOf({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "4"}, {"SLURM_LOCALID", "0"}});
  EXPECT_FALSE(batch.present);
  EXPECT_EQ(batch.worldSize, 1);
  EXPECT_EQ(batch.rank, 0);
  EXPECT_EQ(batch.notice,
            "SLURM_PROCID=0 and SLURM_NTASKS=4 are set but SLURM_STEP_ID is not: this is Slurm's batch script or an "
            "salloc shell, not one of the job's tasks, so it does not wait as rank 0 of 4 (start the ranks with srun "
            "to run them as the job's tasks)");
  // A batch script of one task, or one without --ntasks (no SLURM_NTASKS at all), is simply alone.
  EXPECT_EQ(envOf({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "1"}}).notice, "");
  const RankEnv noTasks = envOf({{"SLURM_PROCID", "0"}});
  EXPECT_FALSE(noTasks.present);
  EXPECT_EQ(noTasks.notice, "");
  // srun's tasks, under either name of the step variable, are ranks.
  for (const char* step : {"SLURM_STEP_ID", "SLURM_STEPID"}) {
    const RankEnv task = envOf(
        {{"SLURM_PROCID", "3"}, {"SLURM_NTASKS", "4"}, {"SLURM_LOCALID", "1"}, {step, "0"}, {"MASTER_ADDR", "h0"}});
    EXPECT_TRUE(task.present) << step;
    EXPECT_EQ(task.source, "slurm");
    EXPECT_EQ(task.rank, 3);
    EXPECT_EQ(task.worldSize, 4);
    EXPECT_EQ(task.localRank, 1);
    EXPECT_EQ(task.origin, "SLURM_PROCID=3 SLURM_NTASKS=4");
    EXPECT_EQ(task.notice, "");
  }
  // A rank that torchrun or poseidon launch started inside the batch script is theirs.
  const RankEnv child = envOf(
      {{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "4"}, {"RANK", "1"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "127.0.0.1"}});
  EXPECT_EQ(child.source, "torchrun");
  EXPECT_EQ(child.origin, "RANK=1 WORLD_SIZE=2");
  EXPECT_EQ(child.notice, "");
}

// torchrun's variables are what poseidon's own launcher sets too; it names itself (POSEIDON_LAUNCHER),
// so that a rank's message says who started it. Another convention is not renamed by a stray one.
TEST(LaunchEnv, PoseidonsLauncherNamesItself) {
  const RankEnv ours = envOf({{"RANK", "0"}, {"WORLD_SIZE", "1"}, {"POSEIDON_LAUNCHER", "poseidon launch"}});
  EXPECT_EQ(ours.source, "poseidon launch");
  EXPECT_EQ(envOf({{"RANK", "0"}, {"WORLD_SIZE", "1"}, {"POSEIDON_LAUNCHER", ""}}).source, "torchrun");
  EXPECT_EQ(refusal({{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"POSEIDON_LAUNCHER", "poseidon train"}}),
            "started by poseidon train (RANK=1 WORLD_SIZE=2) but MASTER_ADDR is not set: export "
            "MASTER_ADDR=<address of rank 0's machine> (127.0.0.1 when every rank runs on this one)");
  const RankEnv mpi = envOf({{"OMPI_COMM_WORLD_RANK", "0"}, {"OMPI_COMM_WORLD_SIZE", "1"},
                             {"POSEIDON_LAUNCHER", "poseidon launch"}});
  EXPECT_EQ(mpi.source, "mpirun");
}

// More than one rank needs MASTER_ADDR under every convention: defaulting to 127.0.0.1 left a rank on
// another machine waiting out its timeout. The error names the variables that made it a rank.
TEST(LaunchEnv, AWorldOfManyNeedsMasterAddrUnderEveryLauncher) {
  EXPECT_EQ(refusal({{"RANK", "1"}, {"WORLD_SIZE", "2"}}),
            "started by torchrun (RANK=1 WORLD_SIZE=2) but MASTER_ADDR is not set: export MASTER_ADDR=<address of "
            "rank 0's machine> (127.0.0.1 when every rank runs on this one)");
  EXPECT_EQ(refusal({{"OMPI_COMM_WORLD_RANK", "0"}, {"OMPI_COMM_WORLD_SIZE", "8"}}),
            "started by mpirun (OMPI_COMM_WORLD_RANK=0 OMPI_COMM_WORLD_SIZE=8) but MASTER_ADDR is not set: export "
            "MASTER_ADDR=<address of rank 0's machine> (127.0.0.1 when every rank runs on this one)");
  EXPECT_EQ(refusal({{"SLURM_PROCID", "2"}, {"SLURM_NTASKS", "3"}, {"SLURM_STEP_ID", "0"}, {"MASTER_ADDR", ""}}),
            "started by slurm (SLURM_PROCID=2 SLURM_NTASKS=3) but MASTER_ADDR is not set: export "
            "MASTER_ADDR=<address of rank 0's machine> (127.0.0.1 when every rank runs on this one)");
  // A world without ranks would be one process on its own, reporting success.
  EXPECT_EQ(refusal({{"WORLD_SIZE", "2"}, {"MASTER_ADDR", "h0"}}),
            "WORLD_SIZE=2 is set but RANK is not: each process of the world needs its own (torchrun convention); "
            "unset WORLD_SIZE to run alone");
  EXPECT_FALSE(envOf({{"WORLD_SIZE", "1"}}).present);  // a world of one is one
  // A world of one is its own coordinator: no address needed.
  EXPECT_EQ(envOf({{"RANK", "0"}, {"WORLD_SIZE", "1"}}).masterAddr, "127.0.0.1");
  EXPECT_EQ(refusal({{"SLURM_PROCID", "0"}, {"SLURM_STEP_ID", "0"}}),
            "SLURM_PROCID is set but SLURM_NTASKS is not (slurm convention)");
}

}  // namespace
}  // namespace poseidon
