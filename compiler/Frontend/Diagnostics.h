//===- Diagnostics.h - Errors that point at the user's text -----*- C++ -*-===//

#ifndef CELLC_COMPILER_FRONTEND_DIAGNOSTICS_H
#define CELLC_COMPILER_FRONTEND_DIAGNOSTICS_H

#include "llvm/ADT/ArrayRef.h"
#include "llvm/ADT/Twine.h"
#include "llvm/Support/MemoryBuffer.h"
#include "llvm/Support/Error.h"
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
  /// An error that only the bound sizes make (a chunk that does not divide):
  /// the cell may be right at other sizes.
  void sizeError(llvm::SMLoc loc, const llvm::Twine &message,
                 llvm::ArrayRef<llvm::SMRange> ranges = {});
  void warning(llvm::SMLoc loc, const llvm::Twine &message,
               llvm::ArrayRef<llvm::SMRange> ranges = {});
  void note(llvm::SMLoc loc, const llvm::Twine &message,
            llvm::ArrayRef<llvm::SMRange> ranges = {});

  unsigned getNumErrors() const { return numErrors; }
  /// Whether every error so far was a size error.
  bool onlySizeErrors() const { return numErrors > 0 && numErrors == numSizeErrors; }
  unsigned getNumWarnings() const { return numWarnings; }
  llvm::SourceMgr &getSourceMgr() { return sourceMgr; }
  llvm::raw_ostream &getStream() { return os; }

private:
  llvm::SourceMgr &sourceMgr;
  llvm::raw_ostream &os;
  unsigned numErrors = 0;
  unsigned numSizeErrors = 0;
  unsigned numWarnings = 0;
};

/// A bad cell, as an llvm::Error: the front end's `file:line:col` messages,
/// and whether only the bound sizes made it bad (a chunk that does not
/// divide), so that a caller can tell "fix the cell" from "use other sizes".
class CellSourceError : public llvm::ErrorInfo<CellSourceError> {
public:
  static char ID;
  CellSourceError(std::string message, bool sizeOnly)
      : message(std::move(message)), sizeOnly(sizeOnly) {}

  void log(llvm::raw_ostream &os) const override { os << message; }
  std::error_code convertToErrorCode() const override {
    return llvm::inconvertibleErrorCode();
  }

  std::string message;
  bool sizeOnly;
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
  /// What was reported, as a CellSourceError.
  llvm::Error takeError() {
    return llvm::make_error<CellSourceError>(diagnostics(), diag.onlySizeErrors());
  }

  llvm::SourceMgr sourceMgr;
  std::string messages;
  llvm::raw_string_ostream os;
  CellDiagnostics diag;
};

} // namespace cellc

#endif // CELLC_COMPILER_FRONTEND_DIAGNOSTICS_H
