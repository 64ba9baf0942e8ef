//===- TuningCache.h - Kernel configs and where tuned ones are kept -*- C++ -*-===//
//
// A kernel config gives a value to each knob of a target; the knobs are
// declared once, in dialects/Cell/IR/Knobs.def, with their legal values.
// cellc-tune (tools/cellc-tune) finds the fastest config of a problem and
// stores it here under the problem's key; the JIT only reads: compileCpu
// looks a config up when it is given the batch size it will run at. Nothing
// here compiles, forks or times anything.
//
//===----------------------------------------------------------------------===//

#ifndef CELLC_JIT_TUNINGCACHE_H
#define CELLC_JIT_TUNINGCACHE_H

#include "compiler/Frontend/Sizes.h"
#include "dialects/Cell/IR/KernelInterface.h"
#include "runtime/cpu/CpuCell.h"

#include "llvm/Support/Error.h"
#include "llvm/Support/JSON.h"

#include <map>
#include <optional>
#include <string>
#include <vector>

namespace cellc::jit {

/// The element type a CPU cell runs in.
using runtime::DType;

/// An error whose message is `message`: what the JIT's functions return.
llvm::Error jitError(const llvm::Twine &message);

/// The cores of this machine.
int cores();

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

/// The tuned config stored under `key`, if any. An entry that is there but
/// cannot be read (corrupt, or not a config) is an error that names its file.
llvm::Expected<std::optional<KernelConfig>>
lookupTuned(llvm::StringRef key, TuneTarget target, llvm::StringRef kernelCacheDir = "");

} // namespace cellc::jit

#endif // CELLC_JIT_TUNINGCACHE_H
