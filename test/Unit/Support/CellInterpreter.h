//===- CellInterpreter.h - A reference interpreter of cell IR ---*- C++ -*-===//
//
// Runs one step of a cell, or of its backward step, in double precision, op by
// op, with plain loops. It is the independent reference that the numeric tests
// check derivatives against, with finite differences on top.
//
//===----------------------------------------------------------------------===//

#ifndef CELLC_TEST_UNIT_SUPPORT_CELLINTERPRETER_H
#define CELLC_TEST_UNIT_SUPPORT_CELLINTERPRETER_H

#include "mlir/IR/Block.h"
#include "mlir/IR/Value.h"

#include <map>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

namespace cellc::testing {

using Tensor = std::vector<double>;

/// Params by name; matrices are row-major.
using ParamValues = std::map<std::string, Tensor>;

class CellInterpreter {
public:
  explicit CellInterpreter(const ParamValues &params) : params(params) {}

  /// Runs `block` on `args` and returns the operands of its terminator
  /// (cell.yield: states then outputs; func.return: the results).
  std::vector<Tensor> run(mlir::Block &block, const std::vector<Tensor> &args);

  /// What the last run's cell.save stored, in slot order.
  std::vector<Tensor> saved;
  /// When set, cell.restore yields these instead of replaying its body, as the
  /// backward kernel does with SAVE_GATES=1.
  std::optional<std::vector<Tensor>> restoreFrom;

private:
  void runOps(mlir::Block &block);
  const Tensor &get(mlir::Value v) { return values.at(key(v)); }
  Tensor &slot(mlir::Value v) { return values[key(v)]; }
  static void *key(mlir::Value v) { return v.getAsOpaquePointer(); }

  const ParamValues &params;
  /// Node-based, so that references to values stay valid as more are added.
  std::unordered_map<void *, Tensor> values;
};

} // namespace cellc::testing

#endif // CELLC_TEST_UNIT_SUPPORT_CELLINTERPRETER_H
