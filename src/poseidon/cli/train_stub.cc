// Built when LibTorch is not available: train and experiment need the LibTorch integration.
#include "poseidon/cli/commands.h"
#include "poseidon/common/error.h"

namespace poseidon::cli {

int trainCommand(const std::vector<std::string>&) {
  throw Error("this poseidon was built without LibTorch (-DPOSEIDON_WITH_TORCH=OFF); install libtorch-dev and rebuild");
}

int experimentCommand(const std::vector<std::string>&) {
  throw Error("this poseidon was built without LibTorch (-DPOSEIDON_WITH_TORCH=OFF); install libtorch-dev and rebuild");
}

int tuneRegretCommand(const std::vector<std::string>&) {
  throw Error("this poseidon was built without LibTorch (-DPOSEIDON_WITH_TORCH=OFF); install libtorch-dev and rebuild");
}

}  // namespace poseidon::cli
