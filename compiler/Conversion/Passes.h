//===- Passes.h - cellc's conversions ---------------------------*- C++ -*-===//

#ifndef CELLC_COMPILER_CONVERSION_PASSES_H
#define CELLC_COMPILER_CONVERSION_PASSES_H

#include "dialects/Cell/IR/CellOps.h"
#include "dialects/Cell/IR/Knobs.h"

#include "mlir/Dialect/Affine/IR/AffineOps.h"
#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/ControlFlow/IR/ControlFlow.h"
#include "mlir/Dialect/LLVMIR/LLVMDialect.h"
#include "mlir/Dialect/LLVMIR/NVVMDialect.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Dialect/GPU/IR/GPUDialect.h"
#include "mlir/Dialect/Math/IR/Math.h"
#include "mlir/Dialect/MemRef/IR/MemRef.h"
#include "mlir/Dialect/SCF/IR/SCF.h"
#include "mlir/Dialect/Vector/IR/VectorOps.h"
#include "mlir/IR/BuiltinOps.h"
#include "mlir/Pass/Pass.h"

namespace mlir::cell {

#define GEN_PASS_DECL
#include "compiler/Conversion/Passes.h.inc"

/// The kernel passes with their knobs (Knobs.def) set from `knobs`, and
/// their other options from `options`.
std::unique_ptr<Pass> createConvertCellToKernels(const cellc::Knobs &knobs);
std::unique_ptr<Pass>
createConvertCellToBatchedKernels(const cellc::Knobs &knobs,
                                  ConvertCellToBatchedKernelsOptions options);
std::unique_ptr<Pass>
createConvertCellToTiledKernels(const cellc::Knobs &knobs,
                                ConvertCellToTiledKernelsOptions options);

#define GEN_PASS_REGISTRATION
#include "compiler/Conversion/Passes.h.inc"

} // namespace mlir::cell

#endif // CELLC_COMPILER_CONVERSION_PASSES_H
