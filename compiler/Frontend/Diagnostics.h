//===- Diagnostics.h - Errors that point at the user's text -----*- C++ -*-===//

#ifndef CELLC_COMPILER_FRONTEND_DIAGNOSTICS_H
#define CELLC_COMPILER_FRONTEND_DIAGNOSTICS_H

#include "llvm/ADT/ArrayRef.h"
#include "llvm/ADT/Twine.h"
#include "llvm/Support/MemoryBuffer.h"
#include "llvm/Support/SourceMgr.h"
#include "llvm/Support/raw_ostream.h"

#include <string>

namespace cellc {

/// Reports front-end diagnostics as `file:line:col: error: message`, followed
/// by the source line with the offending text underlined.
class CellDiagnostics {
public:
  CellDiagnostics(llvm::SourceMgr &sourceMgr, llvm::raw_ostream &os)
      : sourceMgr(sourceMgr), os(os) {}

  void error(llvm::SMLoc loc, const llvm::Twine &message,
             llvm::ArrayRef<llvm::SMRange> ranges = {});
  void warning(llvm::SMLoc loc, const llvm::Twine &message,
               llvm::ArrayRef<llvm::SMRange> ranges = {});
  void note(llvm::SMLoc loc, const llvm::Twine &message,
            llvm::ArrayRef<llvm::SMRange> ranges = {});

  unsigned getNumErrors() const { return numErrors; }
  unsigned getNumWarnings() const { return numWarnings; }
  llvm::SourceMgr &getSourceMgr() { return sourceMgr; }
  llvm::raw_ostream &getStream() { return os; }

private:
  llvm::SourceMgr &sourceMgr;
  llvm::raw_ostream &os;
  unsigned numErrors = 0;
  unsigned numWarnings = 0;
};

/// A cell's source text in its own source manager, with the diagnostics about
/// it collected as text: what every library caller of the front end needs.
struct CellSource {
  CellSource(llvm::StringRef text, llvm::StringRef fileName)
      : os(messages), diag(sourceMgr, os) {
    sourceMgr.AddNewSourceBuffer(
        llvm::MemoryBuffer::getMemBufferCopy(text, fileName), llvm::SMLoc());
  }
  CellSource(const CellSource &) = delete;
  CellSource &operator=(const CellSource &) = delete;

  /// The source text.
  llvm::StringRef text() const {
    return sourceMgr.getMemoryBuffer(sourceMgr.getMainFileID())->getBuffer();
  }
  /// Everything reported so far, as `file:line:col: error: ...` lines.
  const std::string &diagnostics() { return os.str(); }

  llvm::SourceMgr sourceMgr;
  std::string messages;
  llvm::raw_string_ostream os;
  CellDiagnostics diag;
};

} // namespace cellc

#endif // CELLC_COMPILER_FRONTEND_DIAGNOSTICS_H
