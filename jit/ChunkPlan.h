//===- ChunkPlan.h - What a training step of the chunk form holds -*- C++ -*-===//
//
// The memory plan of the chunkwise training form (cellc._chunkwise on the
// CPU, the runtime's chunk kernels): the compiled prologue's and epilogue's
// own plans (driver::SequenceDriver::plan over their kernels), the arrays
// that pass between the parts, and each linear state's core: its copies of
// the gates, keys, values and queries, the state at each chunk's start and
// the chunks' pair weights. `cellc --emit=plan --form=chunk` prints it and
// `cellc.Cell.memory_plan(form="chunk")` returns it.
//
//===----------------------------------------------------------------------===//

#ifndef CELLC_JIT_CHUNKPLAN_H
#define CELLC_JIT_CHUNKPLAN_H

#include "runtime/driver/SequenceDriver.h"

#include "mlir/IR/BuiltinOps.h"
#include "llvm/ADT/ArrayRef.h"
#include "llvm/Support/Error.h"
#include "llvm/Support/raw_ostream.h"

#include <string>
#include <vector>

namespace cellc::jit {

/// The chunk length where a call names none: 64, or for a shorter sequence
/// the power of two (at least 16) that holds it in one chunk.
int64_t defaultChunkLength(int64_t steps);

/// form="auto" takes the chunk form for sequences of at least this many
/// chunks (bench/cpu/chunkwise.py, docs/benchmarks.md).
constexpr int64_t kAutoMinChunks = 4;

/// Whether form="auto" takes the chunk form for a training step of `steps`
/// on the CPU: the cell has one, every linear state's core is a kernel
/// template, and the sequence has at least kAutoMinChunks chunks of `chunk`
/// (0: defaultChunkLength). `why` says why or why not.
bool chunkFormExpected(mlir::ModuleOp cellIR, int64_t steps, int64_t chunk,
                       std::string &why);

/// A training step of the chunk form, in bytes: `total` as the step form's
/// plan has it (its `driver` the chunk form's own kept bytes and peaks, the
/// caller's buffers beside; no pieces), and the kept bytes by part.
struct ChunkPlan {
  int64_t chunk = 0;
  driver::MemoryPlan total;
  /// The compiled prologue's and epilogue's driver buffers, the arrays
  /// between the parts (the prologue's outputs the core or the rest keep,
  /// the reads the rest keeps) and the cores' own (copies, each chunk's
  /// start state, the pair weights).
  int64_t prologueKept = 0, epilogueKept = 0, betweenKept = 0, coreKept = 0;
};

/// The plans of a training step of `steps` x `batch` rows of the cell in
/// `cellIR` (cell IR, as the front end builds it) in the chunk form, one
/// for each of `modes`, chunks of `chunk` steps (0: defaultChunkLength),
/// without resets or lengths; the cell's parts are compiled once. An error
/// where the cell has no chunk form, a state runs the generic core, or its
/// parts cannot be compiled.
llvm::Expected<std::vector<ChunkPlan>>
planChunkForm(mlir::ModuleOp cellIR, llvm::StringRef dtype, int64_t steps, int64_t batch,
              llvm::ArrayRef<driver::Recompute> modes, int64_t chunk = 0);

/// `cellc --emit=plan --form=chunk`'s table: the plan in each of
/// kPlanModes, with the parts' kept bytes.
llvm::Error printChunkMemoryPlan(mlir::ModuleOp cellIR, int64_t steps, int64_t batch,
                                 int64_t chunk, llvm::raw_ostream &os);

} // namespace cellc::jit

#endif // CELLC_JIT_CHUNKPLAN_H
