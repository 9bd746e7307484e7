// LaunchEnv reads the launcher's environment; malformed values are errors naming the variable.
#include <catch2/catch.hpp>

#include <cstdlib>

#include "core/error.h"
#include "transport/launch_env.h"

using tessera::transport::LaunchEnv;

TEST_CASE("LaunchEnv: defaults, torchrun variables, bad values", "[launch_env]") {
  for (const char* name : {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "TESSERA_JOB"}) unsetenv(name);
  auto alone = LaunchEnv::from_env();
  CHECK((alone.rank == 0 && alone.world_size == 1 && alone.local_world_size == 1 && alone.job == "default"));
  setenv("RANK", "3", 1), setenv("WORLD_SIZE", "4", 1), setenv("LOCAL_RANK", "1", 1),
      setenv("LOCAL_WORLD_SIZE", "2", 1), setenv("TESSERA_JOB", "train", 1);
  auto e = LaunchEnv::from_env();
  CHECK((e.rank == 3 && e.world_size == 4 && e.local_rank == 1 && e.local_world_size == 2 && e.job == "train"));
  setenv("WORLD_SIZE", "four", 1);
  CHECK_THROWS_WITH(LaunchEnv::from_env(), Catch::Contains("WORLD_SIZE='four'"));
  setenv("WORLD_SIZE", "2", 1);
  CHECK_THROWS_WITH(LaunchEnv::from_env(), Catch::Contains("RANK=3") && Catch::Contains("WORLD_SIZE=2"));
  for (const char* name : {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "TESSERA_JOB"}) unsetenv(name);
}

// tessera-launch puts the store on TESSERA_STORE_PORT and leaves MASTER_PORT to torch.distributed;
// other launchers (torchrun) give only MASTER_PORT, which the store then uses.
TEST_CASE("LaunchEnv: the store's port is TESSERA_STORE_PORT, else MASTER_PORT", "[launch_env]") {
  unsetenv("TESSERA_STORE_PORT");
  setenv("MASTER_PORT", "29611", 1);
  CHECK(LaunchEnv::from_env().master_port == 29611);
  setenv("TESSERA_STORE_PORT", "29610", 1);
  CHECK(LaunchEnv::from_env().master_port == 29610);
  setenv("TESSERA_STORE_PORT", "70000", 1);
  CHECK_THROWS_WITH(LaunchEnv::from_env(), Catch::Contains("TESSERA_STORE_PORT=70000"));
  unsetenv("TESSERA_STORE_PORT");
  unsetenv("MASTER_PORT");
}
