//===- CpuJit.cpp - Compile a cell to a CPU package, cache it, load it ----===//

#include "jit/CpuJit.h"

#include "jit/KernelCache.h"

#include "compiler/Frontend/IRGen.h"
#include "dialects/Cell/IR/CellOps.h"
#include "runtime/driver/Package.h"

#include "mlir/IR/Diagnostics.h"
#include "mlir/IR/MLIRContext.h"
#include "llvm/Config/llvm-config.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/FormatVariadic.h"
#include "llvm/Support/WithColor.h"
#include "llvm/TargetParser/Host.h"

#include <optional>

using namespace cellc;
using namespace cellc::jit;

llvm::Error cellc::jit::errorOf(const runtime::Status &status) {
  return status ? jitError(status.message()) : llvm::Error::success();
}

llvm::Expected<runtime::Recompute> cellc::jit::parseRecompute(llvm::StringRef text) {
  runtime::Recompute mode;
  if (llvm::Error e = errorOf(runtime::Recompute::parse(text.str(), mode)))
    return std::move(e);
  return mode;
}

//===----------------------------------------------------------------------===//
// Options and configs
//===----------------------------------------------------------------------===//

bool cellc::jit::usesBatchedKernels(const CpuOptions &options) {
  using Kernels = CpuOptions::Kernels;
  switch (options.kernels) {
  case Kernels::Batched:
    return true;
  case Kernels::PerRow:
    return false;
  case Kernels::Auto:
    // A row alone runs the per-row kernels on one thread. With more, the
    // batched kernels split each step's products and element loops over
    // the threads (unit slices), each thread's slice of the weights in its
    // own core's cache: LSTM H = 256, B = 1, T = 200 on two threads ran its
    // forward in 1.45 ms against the per-row kernels' 2.06.
    return options.batchHint != 1 || (options.threads > 0 ? options.threads : cores()) > 1;
  }
  llvm_unreachable("every kind of kernels is handled above");
}

int64_t cellc::jit::hostVectorRegisters() {
  llvm::StringMap<bool> features = llvm::sys::getHostCPUFeatures();
  return features.lookup("avx512f") ? 32 : 16;
}

BatchedShape cellc::jit::batchedShape(const CpuOptions &options) {
  // A block whose accumulators, panel vectors and broadcast fit the vector
  // registers: 6 rows by 4 vectors in AVX-512's 32, 6 by 2 in AVX2's 16.
  // Four vectors divide the outputs of a product over 64 units (16 vectors
  // at H = 256, an LSTM's backward), where three left a third of the last
  // panel unused: 8 x 3, with as many accumulators, ran LSTM 64 x 100's
  // backward products at 327 us a step against 289, and trained 1.5% to 5%
  // slower on one core, up to 8% on two (Zen 4, 2026-11-29).
  bool wide = hostVectorRegisters() >= 32;
  BatchedShape shape;
  // 64 rows, or fewer for a batch known to be smaller: a tile's buffers
  // need not be larger than the rows.
  shape.tile = 64;
  if (options.batchHint > 0 && options.batchHint < 64)
    shape.tile = (options.batchHint + 7) / 8 * 8;
  // Threads that split a batch's rows (CpuCell::splitsRows) each run a
  // tile of their share: a tile's buffers, one set a thread, need not hold
  // more (LSTM 64 x 100 on two threads peaked at 21.4 MiB in chunk:16, 23.2
  // with 64-row tiles; as fast on one thread).
  int threads = options.threads > 0 ? options.threads : cores();
  if (threads > 1 && options.batchHint > 0 &&
      (options.unitSlices == 0 ||
       (options.unitSlices < 0 &&
        CpuCell::splitsRows(options.batchHint, threads, options.weightBytes)))) {
    int64_t share = (options.batchHint + threads - 1) / threads;
    shape.tile = std::min<int64_t>(shape.tile, (share + 7) / 8 * 8);
  }
  if (options.batchTile > 0)
    shape.tile = options.batchTile;
  shape.rows = options.productRows > 0 ? options.productRows : 6;
  shape.vectors = options.productVectors > 0 ? options.productVectors : wide ? 4 : 2;
  return shape;
}

PipelineOptions cellc::jit::pipelineOptionsOf(const CpuOptions &options) {
  PipelineOptions pipeline;
  if (options.batchTiled) {
    pipeline.strategy =
        options.persistent ? KernelStrategy::Persistent : KernelStrategy::BatchTiled;
    pipeline.batchTile = options.batchTile;
    pipeline.ctas = options.ctas;
  } else if (usesBatchedKernels(options)) {
    BatchedShape shape = batchedShape(options);
    pipeline.strategy = KernelStrategy::Batched;
    pipeline.batchTile = shape.tile;
    pipeline.productRows = shape.rows;
    pipeline.productVectors = shape.vectors;
    pipeline.vectorWidth = options.vectorWidth;
    // The host's vectors: with AVX-512's 32 registers the element code and
    // the products' panels run 512 bits at a time (LSTM 64 x 100 trains in
    // 170 against 194 ms, gated DeltaNet in 147 against 157).
    pipeline.vectorBits = hostVectorRegisters() >= 32 ? 512 : 256;
    pipeline.profilePhases = options.profilePhases;
  } else {
    pipeline.strategy = KernelStrategy::PerRow;
  }
  pipeline.matvecWidth = options.matvecWidth;
  pipeline.matvecUnroll = options.matvecUnroll;
  pipeline.splitProjections = !options.step;
  return pipeline;
}

namespace {

/// Knobs.def's Unset of a key whose absence leaves the option as it was.
constexpr std::optional<int64_t> Kept = std::nullopt;

/// A config's value into CpuOptions' member, and back.
void setMember(int &member, int64_t value) { member = value; }
void setMember(int64_t &member, int64_t value) { member = value; }
void setMember(CpuOptions::Kernels &member, int64_t value) {
  member = value ? CpuOptions::Kernels::Batched : CpuOptions::Kernels::PerRow;
}
int64_t valueOf(int64_t member) { return member; }
int64_t valueOf(CpuOptions::Kernels member) {
  switch (member) {
  case CpuOptions::Kernels::Batched:
    return 1;
  case CpuOptions::Kernels::PerRow:
    return 0;
  case CpuOptions::Kernels::Auto:
    break;
  }
  llvm_unreachable("configOf chooses the kernels before it writes them");
}

} // namespace

void cellc::jit::applyConfig(const KernelConfig &config, CpuOptions &options) {
  auto set = [&](auto &member, const char *name, std::optional<int64_t> unset) {
    auto it = config.find(name);
    if (it != config.end())
      setMember(member, it->second);
    else if (unset)
      setMember(member, *unset);
  };
#define CELLC_CPU_TUNE(Name, Member, Unset, Help, ...)                         \
  set(options.Member, #Name, Unset);
#include "dialects/Cell/IR/Knobs.def"
}

KernelConfig cellc::jit::configOf(const CpuOptions &options, int threads) {
  // The options with each choice made: the threads given, the kernels and
  // the batched kernels' shape.
  CpuOptions made = options;
  made.threads = threads;
  made.kernels = usesBatchedKernels(options) ? CpuOptions::Kernels::Batched
                                             : CpuOptions::Kernels::PerRow;
  BatchedShape shape = batchedShape(options);
  made.batchTile = shape.tile;
  made.productRows = shape.rows;
  made.productVectors = shape.vectors;
  return {
#define CELLC_CPU_TUNE(Name, Member, Unset, Help, ...)                         \
  {#Name, valueOf(made.Member)},
#include "dialects/Cell/IR/Knobs.def"
  };
}

std::string cellc::jit::kernelConfigText(const CpuOptions &options) {
  KernelConfig config = configOf(options, 0);
  // How the threads share the work is the runtime's, not the package's.
  config.erase("threads");
  config.erase("unit_slices");
  if (options.profilePhases)
    config["profile_phases"] = 1;
  return str(config);
}

//===----------------------------------------------------------------------===//
// Compile, cache, load
//===----------------------------------------------------------------------===//

llvm::Expected<std::unique_ptr<CpuCell>>
cellc::jit::loadCpuPackage(llvm::StringRef dir, const CpuOptions &options) {
  CpuCell::Options load;
  load.threads = options.threads;
  load.pieceRows = options.pieceRows;
  std::unique_ptr<CpuCell> cell;
  if (llvm::Error e = errorOf(CpuCell::load(dir.str(), load, cell)))
    return std::move(e);
  cell->setUnitSlices(options.unitSlices);
  return cell;
}

namespace {

/// The tuned config for this cell, machine and batch bucket, applied to
/// `options`; whether there was one.
bool applyTuned(llvm::StringRef source, const SizeBindings &sizes, DType dtype,
                CpuOptions &options) {
  if (!options.useTuned || options.batchHint <= 0 || !options.chunkPart.empty())
    return false;
  std::string key = tuningKey(source, sizes, dtype, options.batchHint, TuneTarget::Cpu,
                              deviceName(TuneTarget::Cpu));
  auto tuned = lookupTuned(key, TuneTarget::Cpu, options.cacheDir);
  if (!tuned) {
    // Lost tuning is worth a word, not a failure: the default config runs.
    llvm::WithColor::warning(llvm::errs(), "cellc")
        << llvm::toString(tuned.takeError())
        << "; it is ignored and the default config used (cellc-tune writes it again)\n";
    return false;
  }
  if (!*tuned)
    return false;
  applyConfig(**tuned, options);
  return true;
}

/// The package's cache key: the kernels as lowered to the LLVM dialect (so
/// any change in the cell, its sizes, dtype or variant, or in this
/// compiler's lowering changes it), kernels.json, LLVM's version (which
/// generates the code) and the host CPU (which it generates the code for).
std::string packageKey(const CpuPackage &package) {
  std::string lowered[2];
  for (int variant : {0, 1}) {
    llvm::raw_string_ostream ir(lowered[variant]);
    mlir::ModuleOp module = package.variants[variant].get();
    module.print(ir);
  }
  return KernelCache::key({compilerVersion(), LLVM_VERSION_STRING, lowered[1], lowered[0],
                           package.json(), deviceName(TuneTarget::Cpu), "O3"});
}

/// Writes `package` into a fresh temporary directory.
llvm::Expected<std::string> writeTemporary(const CpuPackage &package) {
  llvm::SmallString<128> dir;
  if (std::error_code ec = llvm::sys::fs::createUniqueDirectory("cellc-package", dir))
    return jitError("cannot create a temporary directory: " + ec.message());
  if (llvm::Error e = writeCpuPackage(package, dir)) {
    llvm::sys::fs::remove_directories(dir);
    return std::move(e);
  }
  return std::string(dir);
}

} // namespace

llvm::Expected<PreparedPackage>
cellc::jit::prepareCpuPackage(llvm::StringRef source, llvm::StringRef fileName,
                              const SizeBindings &sizes, DType dtype, CpuOptions options) {
  mlir::MLIRContext context;
  CellSource src(source, fileName);
  mlir::FloatType element = dtype == DType::F32
                                ? mlir::FloatType(mlir::Float32Type::get(&context))
                                : mlir::FloatType(mlir::Float64Type::get(&context));
  auto module = compileCellSource(context, sizes, element, src.diag);
  if (!module)
    return src.takeError();
  mlir::SourceMgrDiagnosticHandler handler(src.sourceMgr, &context, src.os);
  if (!options.chunkPart.empty()) {
    if (llvm::Error e = takeChunkPart(*module, options.chunkPart))
      return jitError(llvm::toString(std::move(e)) + ":\n" + src.diagnostics());
  }
  std::vector<std::vector<int64_t>> paramShapes;
  module->walk([&](mlir::cell::ParamOp param) {
    paramShapes.push_back(llvm::cast<mlir::RankedTensorType>(param.getType()).getShape().vec());
  });
  options.weightBytes = CpuCell::matrixBytes(paramShapes, dtype == DType::F32 ? 4 : 8);

  PreparedPackage prepared;
  // A tuned config for this cell, machine and batch bucket replaces the
  // knobs given.
  if (applyTuned(source, sizes, dtype, options))
    prepared.origin = "tuned";
  prepared.threads = options.threads;
  prepared.unitSlices = options.unitSlices;
  if (const char *log = std::getenv("CELLC_LOG"); log && llvm::StringRef(log).contains("tune"))
    llvm::errs() << "cellc: " << fileName << ": " << prepared.origin << " config "
                 << str(configOf(options, options.threads > 0 ? options.threads : cores()))
                 << "\n";

  auto package = buildCpuPackage(*module, pipelineOptionsOf(options),
                                 dtype == DType::F32 ? "f32" : "f64",
                                 kernelConfigText(options));
  if (!package)
    return jitError(llvm::toString(package.takeError()) + ":\n" + src.diagnostics());
  if (options.useCache) {
    KernelCache cache(options.cacheDir);
    std::string key = packageKey(*package);
    if (std::optional<std::string> dir = cache.findPackage(key)) {
      prepared.dir = *dir;
      prepared.fromCache = true;
      return prepared;
    }
    auto dir = cache.storePackage(
        key, [&](llvm::StringRef to) { return writeCpuPackage(*package, to); });
    if (dir) {
      prepared.dir = *dir;
      return prepared;
    }
    // A cache that cannot be written only costs the next run a compile.
    llvm::consumeError(dir.takeError());
  }
  auto dir = writeTemporary(*package);
  if (!dir)
    return dir.takeError();
  prepared.dir = *dir;
  prepared.temporary = true;
  return prepared;
}

llvm::Expected<std::unique_ptr<CpuCell>>
cellc::jit::compileCpu(llvm::StringRef source, llvm::StringRef fileName,
                       const SizeBindings &sizes, DType dtype, CpuOptions options) {
  auto prepared = prepareCpuPackage(source, fileName, sizes, dtype, options);
  if (!prepared)
    return prepared.takeError();
  options.threads = prepared->threads;
  options.unitSlices = prepared->unitSlices;
  auto cell = loadCpuPackage(prepared->dir, options);
  // The shared objects stay mapped once the files are gone.
  if (prepared->temporary)
    llvm::sys::fs::remove_directories(prepared->dir);
  if (!cell)
    return cell.takeError();
  (*cell)->setOrigin(prepared->fromCache, prepared->origin);
  return cell;
}

//===----------------------------------------------------------------------===//
// The memory table of --emit=plan
//===----------------------------------------------------------------------===//

llvm::Expected<driver::Interface> cellc::jit::kernelInterface(mlir::ModuleOp cell,
                                                              const PipelineOptions &options,
                                                              llvm::StringRef dtype) {
  auto package = buildCpuPackage(cell, options, dtype, "", /*lower=*/false);
  if (!package)
    return package.takeError();
  driver::PackageInfo info;
  if (llvm::Error e = errorOf(driver::parsePackage(package->json(), "(plan)", info)))
    return std::move(e);
  return info.interface;
}

namespace {

/// Prints what a training step of `steps` x `batch` holds on the CPU in each
/// recompute mode: driver::SequenceDriver::plan over the kernels' interface,
/// read from the kernels.json that `options` give (no code generation).
llvm::Error printMemoryPlan(mlir::ModuleOp cellIR, const PipelineOptions &options,
                            int64_t steps, int64_t batch, llvm::raw_ostream &os) {
  auto def = *cellIR.getOps<mlir::cell::DefOp>().begin();
  mlir::Type element =
      llvm::cast<mlir::RankedTensorType>(def.getStates()[0].getType()).getElementType();
  if (!element.isF32() && !element.isF64())
    return llvm::Error::success();
  auto interface = kernelInterface(cellIR, options, element.isF32() ? "f32" : "f64");
  if (!interface)
    return interface.takeError();

  // Every plan first: an error prints no part of the table.
  const auto &modes = kPlanModes;
  driver::MemoryPlan plans[4];
  for (int m = 0; m < 4; ++m)
    if (llvm::Error e = errorOf(driver::SequenceDriver::plan(
            *interface, steps, batch, *driver::Recompute::parse(modes[m]), plans[m])))
      return e;
  auto mib = [](int64_t bytes) { return llvm::formatv("{0,9:F1}", bytes / 1048576.0); };
  os << llvm::formatv("a training step of T = {0} steps x B = {1} rows on one thread, "
                      "MiB (SequenceDriver::plan):\n",
                      steps, batch);
  os << "  mode            kept  fwd peak  bwd peak      peak     floor  piece\n";
  driver::MemoryPlan plan;
  for (int m = 0; m < 4; ++m) {
    const char *text = modes[m];
    plan = plans[m];
    os << llvm::formatv("  {0,-10} {1} {2} {3} {4} {5} {6,6}\n", text,
                        mib(plan.driver.kept), mib(plan.driver.forwardPeak),
                        mib(plan.driver.backwardPeak), mib(plan.peak()),
                        mib(plan.floor()), plan.pieceSteps);
  }
  // The caller's buffers are the same in every mode.
  os << llvm::formatv(
      "  kept: what forward keeps for backward (an output that is a state is not "
      "counted twice);\n"
      "  fwd/bwd peak: the most the runtime holds at once in each, kept bytes and the "
      "kernels' own buffers included;\n"
      "  peak: the most held at once over the step with the outputs ({0} MiB), their "
      "gradients ({1} MiB) and the inputs' and params' gradients ({2} MiB);\n"
      "  floor: what any implementation holds at the end: those gradients, the "
      "outputs and the kept states; piece: the steps of a piece\n",
      llvm::formatv("{0:F1}", plan.outputs / 1048576.0),
      llvm::formatv("{0:F1}", plan.gradOutputs / 1048576.0),
      llvm::formatv("{0:F1}", (plan.gradInputs + plan.gradParams) / 1048576.0));
  return llvm::Error::success();
}

} // namespace

llvm::Error cellc::jit::printStage(mlir::ModuleOp module, Emit emit,
                                   const PipelineOptions &options, llvm::StringRef chip,
                                   llvm::raw_ostream &os) {
  // The plan's memory table builds the kernels from the cell IR.
  mlir::OwningOpRef<mlir::ModuleOp> cellIR;
  if (emit == Emit::Plan)
    cellIR = module.clone();
  if (llvm::Error e = cellc::printStage(module, emit, options, chip, os))
    return e;
  if (emit != Emit::Plan)
    return llvm::Error::success();
  PipelineOptions cpu = options;
  if (isCudaStrategy(cpu.strategy) || cpu.target == Target::Cuda)
    cpu = PipelineOptions();
  return printMemoryPlan(*cellIR, cpu, options.planSteps, options.planBatch, os);
}
