#include "poseidon/common/file.h"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>

#include "poseidon/common/error.h"

namespace poseidon {

void writeFileAtomically(const std::string& path, const std::string& text, const std::string& what) {
  const std::string tmp = path + ".tmp";
  {
    errno = 0;
    std::ofstream f(tmp);
    f << text;
    f.flush();
    if (!f) throw IoError(strCat("cannot write ", what, " ", path, ": ", errno ? std::strerror(errno) : "write failed"));
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0)
    throw IoError(strCat("cannot write ", what, " ", path, ": ", std::strerror(errno)));
}

}  // namespace poseidon
