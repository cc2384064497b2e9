#include "poseidon/common/file.h"

#include <cstdio>
#include <fstream>

#include "poseidon/common/error.h"

namespace poseidon {

void writeFileAtomically(const std::string& path, const std::string& text, const std::string& what) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream f(tmp);
    f << text;
    if (!f) throw IoError(strCat("cannot write ", what, " ", path));
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) throw IoError(strCat("cannot write ", what, " ", path));
}

}  // namespace poseidon
