//===- ToolVersion.h - What `--version` prints for cellc's tools -*- C++ -*-===//

#ifndef CELLC_TOOLS_TOOLVERSION_H
#define CELLC_TOOLS_TOOLVERSION_H

#include "llvm/Config/llvm-config.h"
#include "llvm/Support/CommandLine.h"
#include "llvm/Support/raw_ostream.h"

namespace cellc {

/// Makes `--version` name cellc's version first and the LLVM it is built on
/// second, instead of LLVM's version alone.
inline void setToolVersionPrinter(llvm::StringRef tool) {
  static std::string name;
  name = tool.str();
  llvm::cl::SetVersionPrinter([](llvm::raw_ostream &os) {
    os << name << " (cellc) " << CELLC_VERSION << "\n"
       << "  built with LLVM/MLIR " << LLVM_VERSION_STRING << "\n";
  });
}

} // namespace cellc

#endif // CELLC_TOOLS_TOOLVERSION_H
