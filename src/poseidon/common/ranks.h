// Rank lists in messages: "2,3" or "1-4,7".
#pragma once

#include <string>
#include <vector>

namespace poseidon {

// Ranks in ascending order, runs of three or more shortened to "first-last".
inline std::string formatRanks(const std::vector<int>& ranks) {
  std::string out;
  for (size_t i = 0; i < ranks.size();) {
    size_t j = i;
    while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) ++j;
    if (!out.empty()) out += ",";
    out += std::to_string(ranks[i]);
    if (j > i + 1) out += "-" + std::to_string(ranks[j]);
    else if (j == i + 1) out += "," + std::to_string(ranks[j]);
    i = j + 1;
  }
  return out;
}

}  // namespace poseidon
