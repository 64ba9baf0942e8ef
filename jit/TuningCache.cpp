//===- TuningCache.cpp - Kernel configs and where tuned ones are kept ------===//

#include "jit/TuningCache.h"

#include "dialects/Cell/IR/Knobs.h"
#include "jit/KernelCache.h"
#include "runtime/cpu/ThreadPool.h"

#include "llvm/ADT/StringMap.h"
#include "llvm/Support/Path.h"
#include "llvm/TargetParser/Host.h"

#include <algorithm>
#include <thread>

using namespace cellc;
using namespace cellc::jit;

llvm::Error cellc::jit::jitError(const llvm::Twine &message) {
  return llvm::createStringError(llvm::inconvertibleErrorCode(), message);
}

int cellc::jit::cores() { return runtime::cores(); }

//===----------------------------------------------------------------------===//
// Knobs and configs
//===----------------------------------------------------------------------===//

llvm::Expected<TuneTarget> cellc::jit::parseTuneTarget(llvm::StringRef text) {
  if (std::optional<Target> target = parse<Target>(text.str()))
    return *target;
  return jitError("unknown target '" + text + "'; expected " + Words<Target>::expected());
}

std::vector<Knob> cellc::jit::knobsOf(TuneTarget target) {
  std::vector<Knob> knobs;
  if (target == TuneTarget::Cpu) {
    // The CPU JIT's config keys of Knobs.def; one without values, the
    // threads, takes this machine's: powers of two below its cores, and
    // its cores.
    std::vector<int64_t> threads;
    for (int t = 1; t < cores(); t *= 2)
      threads.push_back(t);
    threads.push_back(cores());
    for (const CpuTuneKnob &knob : cpuTuneKnobs())
      knobs.push_back(
          {knob.name, knob.help, knob.values.empty() ? threads : knob.values});
    return knobs;
  }
  // CUDA: the knobs of Knobs.def that cellc-tune searches.
  for (const CudaTuneKnob &knob : cudaTuneKnobs())
    knobs.push_back({knob.name, knob.help, knob.values});
  return knobs;
}

std::string cellc::jit::str(const KernelConfig &config) {
  std::string text;
  for (const auto &[name, value] : config)
    text += (text.empty() ? "" : ",") + name + "=" + std::to_string(value);
  return text;
}

llvm::json::Object cellc::jit::toJSON(const KernelConfig &config) {
  llvm::json::Object object;
  for (const auto &[name, value] : config)
    object[name] = value;
  return object;
}

llvm::Expected<KernelConfig>
cellc::jit::configFromJSON(const llvm::json::Value &value, TuneTarget target) {
  const llvm::json::Object *object = value.getAsObject();
  if (!object)
    return jitError("a kernel config must be a JSON object");
  KernelConfig config;
  for (const Knob &knob : knobsOf(target)) {
    std::optional<int64_t> v = object->getInteger(knob.name);
    if (!v)
      return jitError("the kernel config has no integer '" + knob.name + "'");
    config[knob.name] = *v;
  }
  return config;
}

//===----------------------------------------------------------------------===//
// The tuning cache
//===----------------------------------------------------------------------===//

int64_t cellc::jit::batchBucket(int64_t batch) {
  int64_t bucket = 1;
  while (bucket < batch)
    bucket *= 2;
  return bucket;
}

std::string cellc::jit::deviceName(TuneTarget target) {
  if (target == TuneTarget::Cuda)
    return "cuda:0";
  std::string host = llvm::sys::getHostCPUName().str();
  for (const auto &feature : llvm::sys::getHostCPUFeatures())
    if (feature.second)
      host += "," + feature.first().str();
  return host;
}

std::string cellc::jit::tuningKey(llvm::StringRef source,
                                      const SizeBindings &sizes, DType dtype,
                                      int64_t batch, TuneTarget target,
                                      llvm::StringRef device) {
  std::string sizeText;
  for (const auto &[name, value] : sizes)
    sizeText += name + "=" + std::to_string(value) + ";";
  std::string bucket = "B<=" + std::to_string(batchBucket(batch));
  return KernelCache::key({"tune", source, name(target), device,
                           dtype == DType::F32 ? "f32" : "f64", sizeText, bucket,
                           compilerVersion()});
}

std::string cellc::jit::tuningCacheDir(llvm::StringRef kernelCacheDir) {
  llvm::SmallString<256> dir(kernelCacheDir.empty() ? KernelCache::defaultDir()
                                                    : kernelCacheDir.str());
  llvm::sys::path::append(dir, "tuning");
  return dir.str().str();
}

llvm::Expected<std::optional<KernelConfig>>
cellc::jit::lookupTuned(llvm::StringRef key, TuneTarget target,
                            llvm::StringRef kernelCacheDir) {
  KernelCache cache(tuningCacheDir(kernelCacheDir));
  auto entry = cache.loadChecked(key);
  if (!entry)
    return entry.takeError();
  if (!*entry)
    return std::nullopt;
  auto unreadable = [&](llvm::Twine why) {
    return llvm::createStringError(std::make_error_code(std::errc::invalid_argument),
                                   "the tuning-cache entry " + cache.pathOf(key) +
                                       " is not a config: " + why);
  };
  llvm::Expected<llvm::json::Value> json = llvm::json::parse((*entry)->getBuffer());
  if (!json)
    return unreadable(llvm::toString(json.takeError()));
  const llvm::json::Object *object = json->getAsObject();
  const llvm::json::Value *config = object ? object->get("config") : nullptr;
  if (!config)
    return unreadable("no \"config\"");
  llvm::Expected<KernelConfig> parsed = configFromJSON(*config, target);
  if (!parsed)
    return unreadable(llvm::toString(parsed.takeError()));
  return std::optional<KernelConfig>(*parsed);
}

