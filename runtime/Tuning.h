//===- Tuning.h - Kernel configs, their knobs, and the autotuner -*- C++ -*-===//
//
// A kernel config gives a value to each knob of a target. The knobs are
// described once, in Tuning.cpp, with their legal values. `tune` times the
// candidates of a problem (each in a child process, checked against the
// default config first), and the winner goes into the tuning cache, which
// CpuCell::compile reads when it is given the batch size it will run at.
//
//===----------------------------------------------------------------------===//

#ifndef CELLC_RUNTIME_TUNING_H
#define CELLC_RUNTIME_TUNING_H

#include "runtime/CpuCell.h"
#include "dialects/Cell/IR/KernelInterface.h"

#include "llvm/Support/JSON.h"

#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace cellc::runtime {

/// The target a tune is for (KernelInterface.def).
using TuneTarget = Target;
/// `text` as a target, or an error that lists the targets.
llvm::Expected<TuneTarget> parseTuneTarget(llvm::StringRef text);

/// One knob: its name, what it changes, and its legal values.
struct Knob {
  std::string name;
  std::string help;
  std::vector<int64_t> values;
};

/// The knobs of `target` on this machine (threads go up to its cores).
std::vector<Knob> knobsOf(TuneTarget target);

/// A value for each knob of a target, by knob name.
using KernelConfig = std::map<std::string, int64_t>;
/// `name=value` pairs, comma-separated, in knob order.
std::string str(const KernelConfig &config);
llvm::json::Object toJSON(const KernelConfig &config);
llvm::Expected<KernelConfig> configFromJSON(const llvm::json::Value &value,
                                            TuneTarget target);

/// The config that runs untuned: a heuristic for `batch` rows.
KernelConfig defaultConfig(TuneTarget target, int64_t batch);

/// Sets the knobs of a CPU config in `options`.
void applyConfig(const KernelConfig &config, CpuCell::Options &options);
/// The CPU config that `options` describe, with `threads` resolved.
KernelConfig configOf(const CpuCell::Options &options, int threads);

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
};

/// The power of two at or above `batch`: tunes are shared within a bucket.
int64_t batchBucket(int64_t batch);
/// The CPU model and its features, or the GPU's name: part of the key.
std::string deviceName(TuneTarget target);
/// The tuning-cache key: the cell's text, target, device, dtype, sizes, batch
/// bucket and compiler version.
std::string tuningKey(llvm::StringRef source, const SizeBindings &sizes,
                      DType dtype, int64_t batch, TuneTarget target,
                      llvm::StringRef device);
/// The tuning cache's directory: `tuning` in the kernel cache's.
std::string tuningCacheDir(llvm::StringRef kernelCacheDir = "");

/// The tuned config stored under `key`, if any.
std::optional<KernelConfig> lookupTuned(llvm::StringRef key, TuneTarget target,
                                        llvm::StringRef kernelCacheDir = "");

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

} // namespace cellc::runtime

#endif // CELLC_RUNTIME_TUNING_H
