//===- ToolOptions.h - The command lines of cellc's tools --------*- C++ -*-===//

#ifndef CELLC_TOOLS_TOOLOPTIONS_H
#define CELLC_TOOLS_TOOLOPTIONS_H

#include "llvm/Config/llvm-config.h"
#include "llvm/Support/CommandLine.h"
#include "llvm/Support/raw_ostream.h"

namespace cellc {

/// The category of a tool's own options: `--help` lists these, not the
/// hundreds that LLVM's backends register (which are still taken).
inline llvm::cl::OptionCategory &toolOptions() {
  static llvm::cl::OptionCategory category("Options");
  return category;
}

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

/// Makes `--help` list the tool's own options (those in toolOptions()).
inline void hideLibraryOptions() { llvm::cl::HideUnrelatedOptions(toolOptions()); }

} // namespace cellc

#endif // CELLC_TOOLS_TOOLOPTIONS_H
