// Where a rank's place in the job comes from (launch/env.h): the launchers' variables.
#include "poseidon/launch/env.h"

#include <gtest/gtest.h>

#include <map>
#include <string>

namespace poseidon {
namespace {

RankEnv envOf(std::map<std::string, std::string> vars) {
  return rankFromEnvironment([vars](const char* name) -> const char* {
    auto it = vars.find(name);
    return it == vars.end() ? nullptr : it->second.c_str();
  });
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
  const RankEnv slurm = envOf({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "1"}, {"MASTER_ADDR", "h0"}});
  EXPECT_EQ(slurm.masterAddr, "h0");
}

}  // namespace
}  // namespace poseidon
