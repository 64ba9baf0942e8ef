//===- cellc-opt.cpp - Runs cell passes on MLIR, for lit tests ------------===//

#include "dialects/Cell/IR/CellDialect.h"
#include "compiler/Conversion/Passes.h"
#include "compiler/Pipelines/Pipelines.h"
#include "dialects/Cell/Transforms/Passes.h"
#include "tools/ToolOptions.h"

#include "mlir/IR/DialectRegistry.h"
#include "mlir/InitAllDialects.h"
#include "mlir/InitAllPasses.h"
#include "mlir/Tools/mlir-opt/MlirOptMain.h"

/// cellc-opt's main, a C function so that libcellc.so can export it;
/// tools/ToolMain.cpp makes it the executable. Its options are MLIR's, which
/// MlirOptMain registers when it runs.
extern "C" int cellc_tool_opt(int argc, char **argv) {
  cellc::setToolVersionPrinter("cellc-opt");
  mlir::registerAllPasses();
  mlir::cell::registerCellPasses();
  mlir::cell::registerCellConversionPasses();
  cellc::registerPipelines();
  mlir::DialectRegistry registry;
  mlir::registerAllDialects(registry);
  registry.insert<mlir::cell::CellDialect>();
  return mlir::asMainReturnCode(
      mlir::MlirOptMain(argc, argv, "cellc optimizer driver\n", registry));
}
