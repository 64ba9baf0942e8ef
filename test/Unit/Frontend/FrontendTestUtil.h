//===- FrontendTestUtil.h - Shared setup for front-end unit tests -*- C++ -*-===//

#ifndef CELLC_TEST_UNIT_FRONTEND_FRONTENDTESTUTIL_H
#define CELLC_TEST_UNIT_FRONTEND_FRONTENDTESTUTIL_H

#include "compiler/Frontend/Diagnostics.h"
#include "compiler/Frontend/Parser.h"

#include "llvm/Support/MemoryBuffer.h"
#include "llvm/Support/SourceMgr.h"

#include <memory>
#include <string>

namespace cellc::testing {

/// A source buffer named `test.cell` and a diagnostic engine that writes into
/// `messages`.
struct Source {
  explicit Source(llvm::StringRef text)
      : os(messages), diag(sourceMgr, os) {
    sourceMgr.AddNewSourceBuffer(
        llvm::MemoryBuffer::getMemBufferCopy(text, "test.cell"), llvm::SMLoc());
  }

  llvm::StringRef buffer() const {
    return sourceMgr.getMemoryBuffer(sourceMgr.getMainFileID())->getBuffer();
  }

  std::unique_ptr<CellAST> parse() {
    Parser parser(buffer(), diag);
    return parser.parseCell();
  }

  const std::string &diagnostics() { return os.str(); }

  llvm::SourceMgr sourceMgr;
  std::string messages;
  llvm::raw_string_ostream os;
  CellDiagnostics diag;
};

} // namespace cellc::testing

#endif // CELLC_TEST_UNIT_FRONTEND_FRONTENDTESTUTIL_H
