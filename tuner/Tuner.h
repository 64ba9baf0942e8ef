//===- Tuner.h - The autotuner of cellc-tune ----------------------*- C++ -*-===//
//
// `tune` times the candidate configs of a problem (each in a child process,
// checked against the default config first; CUDA candidates compiled and
// pruned by ptxas's budgets for the problem's chip), and the winner goes into
// the tuning cache (runtime/TuningCache.h), which the runtime reads. This
// library is cellc-tune's: the runtime does not link it, and Python runs
// cellc-tune in a process of its own (cellc.autotune).
//
//===----------------------------------------------------------------------===//

#ifndef CELLC_COMPILER_TUNER_TUNER_H
#define CELLC_COMPILER_TUNER_TUNER_H

#include "jit/CpuJit.h"
#include "jit/TuningCache.h"

#include <functional>
#include <string>
#include <vector>

namespace cellc::tuner {

using namespace cellc::jit;
using namespace cellc::runtime;

/// The config that runs untuned: a heuristic for `batch` rows.
KernelConfig defaultConfig(TuneTarget target, int64_t batch);

/// What a tune is for.
struct TuneProblem {
  std::string source;
  std::string fileName = "<cell>";
  SizeBindings sizes;
  DType dtype = DType::F32;
  int64_t batch = 64;
  int64_t steps = 100;
  /// Timed with SAVE_GATES=1 (recompute none) or 0 (full).
  bool saveGates = true;
  TuneTarget target = TuneTarget::Cpu;
  /// CUDA: the chip the PTX is for and ptxas checks against.
  std::string chip = "sm_90";
};

/// One config tried.
struct Candidate {
  enum class Status { Untried, Ok, Pruned, CompileError, Crashed, Wrong, OverBudget };
  KernelConfig config;
  Status status = Status::Untried;
  std::string note;
  double medianMs = 0;
  int repeats = 0;
  double error = 0;
  /// CUDA, from ptxas -v (-1: not known): the forward and backward kernels'
  /// registers, spilled bytes and shared memory.
  int registers = -1, spillBytes = -1, sharedBytes = -1;
};
llvm::StringRef nameOf(Candidate::Status status);

struct TuneOptions {
  /// Seconds for the whole tune; candidates left when it runs out are
  /// reported as over budget.
  double budgetSeconds = 60;
  /// Compile and prune only (CUDA without a GPU).
  bool compileOnly = false;
  /// Whether the winner is written to the tuning cache.
  bool store = true;
  std::string cacheDir;
  /// Called before (`done` false) and after each candidate.
  std::function<void(const Candidate &, size_t index, size_t total, bool done)>
      progress;
  /// Called when the tune starts a stage that is not a candidate.
  std::function<void(llvm::StringRef)> stage;
};

struct TuneResult {
  /// The candidates in the order tried; the first is the default config.
  std::vector<Candidate> candidates;
  /// The fastest correct candidate, or -1.
  int winner = -1;
  /// The winner's speedup over the default when both were rerun alternating
  /// (0: not rerun, the default won in the first pass).
  double confirmedSpeedup = 0;
  double seconds = 0;
  std::string key;
  std::string device;
  bool stored = false;
};

/// Tunes `problem`. Errors are for the problem itself (a bad cell or size,
/// a missing target); a candidate that fails is reported in the result.
llvm::Expected<TuneResult> tune(const TuneProblem &problem,
                                const TuneOptions &options);

/// The table of candidates, with times and speedups over the default.
std::string formatTable(const TuneResult &result);
llvm::json::Value toJSON(const TuneResult &result, const TuneProblem &problem);

} // namespace cellc::tuner

#endif // CELLC_COMPILER_TUNER_TUNER_H
