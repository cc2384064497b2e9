// Small files written whole: summaries, traces, progress reports.
#pragma once

#include <string>

namespace poseidon {

// Writes `text` to path.tmp and renames it over `path`, so a reader never sees a half-written
// file. Throws IoError("cannot write <what> <path>"). (Checkpoints, which must also survive a
// crash, add fsync: torch/checkpoint.cc.)
void writeFileAtomically(const std::string& path, const std::string& text, const std::string& what);

}  // namespace poseidon
