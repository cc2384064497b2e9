// poseidon bench: the emulated-cluster benchmark (see bench/README.md).
#include "poseidon/cli/commands.h"
#include "poseidon/common/error.h"

namespace poseidon::cli {

int benchCommand(const std::vector<std::string>&, const std::string&) {
  throw Error("poseidon bench is not implemented in this build yet");
}

int benchWorkerCommand(const std::vector<std::string>&) {
  throw Error("poseidon bench-worker is not implemented in this build yet");
}

}  // namespace poseidon::cli
