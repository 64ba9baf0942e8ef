//===- FrontendFuzzer.cpp - libFuzzer target for the cell front end -------===//
//
// Feeds arbitrary bytes to the parser and the IR builder. Any crash, sanitizer
// report or broken invariant is a bug: bad input must end in a reported error,
// and good input in verified IR.
//
//===----------------------------------------------------------------------===//

#include "compiler/Frontend/IRGen.h"

#include "mlir/IR/BuiltinTypes.h"
#include "mlir/IR/MLIRContext.h"
#include "mlir/IR/Verifier.h"

#include <cstdlib>
#include <memory>

using namespace cellc;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  // A context interns every type and name it sees; start a fresh one now and
  // then so that a long run measures the front end, not the interner.
  static std::unique_ptr<mlir::MLIRContext> context;
  static unsigned runs = 0;
  if (!context || ++runs % 20000 == 0) {
    context = std::make_unique<mlir::MLIRContext>(
        mlir::MLIRContext::Threading::DISABLED);
    loadFrontendDialects(*context);
  }

  CellSource src(llvm::StringRef(reinterpret_cast<const char *>(data), size),
                 "fuzz.cell");
  CellDiagnostics &diag = src.diag;
  SizeBindings sizes = {{"H", 4}, {"I", 3}, {"N", 2}};
  auto module = compileCellSource(
      *context, sizes, mlir::Float32Type::get(context.get()), diag);
  if (module && mlir::failed(mlir::verify(*module)))
    std::abort(); // The builder produced IR that does not verify.
  if (!module && diag.getNumErrors() == 0)
    std::abort(); // It failed without telling the user why.
  if (module && diag.getNumErrors() != 0)
    std::abort(); // It reported an error and still produced IR.
  return 0;
}
