//===- Diagnostics.cpp - Errors that point at the user's text -------------===//

#include "compiler/Frontend/Diagnostics.h"

using namespace cellc;

char CellSourceError::ID = 0;

void CellDiagnostics::error(llvm::SMLoc loc, const llvm::Twine &message,
                             llvm::ArrayRef<llvm::SMRange> ranges) {
  ++numErrors;
  sourceMgr.PrintMessage(os, loc, llvm::SourceMgr::DK_Error, message, ranges);
}

void CellDiagnostics::sizeError(llvm::SMLoc loc, const llvm::Twine &message,
                                llvm::ArrayRef<llvm::SMRange> ranges) {
  ++numSizeErrors;
  error(loc, message, ranges);
}

void CellDiagnostics::warning(llvm::SMLoc loc, const llvm::Twine &message,
                               llvm::ArrayRef<llvm::SMRange> ranges) {
  ++numWarnings;
  sourceMgr.PrintMessage(os, loc, llvm::SourceMgr::DK_Warning, message, ranges);
}

void CellDiagnostics::note(llvm::SMLoc loc, const llvm::Twine &message,
                            llvm::ArrayRef<llvm::SMRange> ranges) {
  sourceMgr.PrintMessage(os, loc, llvm::SourceMgr::DK_Note, message, ranges);
}
