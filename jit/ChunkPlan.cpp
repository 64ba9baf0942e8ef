//===- ChunkPlan.cpp - What a training step of the chunk form holds -------===//
//
// The chunk form runs as cellc._chunkwise lays it out on the CPU: the
// compiled prologue over all T * B rows (over T steps where it steps a gate-
// only state), each linear state's core on the runtime's kernels
// (cellc._chunkcore's _NativeDiagonalCore and _NativeDeltaCore), the
// compiled epilogue on the reads; torch's autograd chains them and keeps
// what each part's backward reads. The plan counts those arrays as that
// code makes them: a factor that is a prologue's output [T, B, n] as it is
// is a view of it; a product of factors, a scalar gate spread over K, a
// negated value or a scaled read is an array of its own.
//
//===----------------------------------------------------------------------===//

#include "jit/ChunkPlan.h"

#include "jit/CpuJit.h"

#include "dialects/Cell/IR/CellOps.h"
#include "dialects/Cell/Transforms/LinearRecurrence.h"
#include "runtime/driver/Package.h"

#include "mlir/Pass/PassManager.h"
#include "llvm/ADT/DenseSet.h"
#include "llvm/Support/FormatVariadic.h"

#include <algorithm>

using namespace cellc;
using namespace cellc::jit;
using namespace mlir::cell;

int64_t cellc::jit::defaultChunkLength(int64_t steps) {
  if (steps >= 64)
    return 64;
  int64_t L = 16;
  while (L < steps)
    L *= 2;
  return L;
}

int64_t ChunkPlan::peak() const {
  int64_t held = outputs + finalStates;
  return std::max(held + forwardPeak,
                  held + gradOutputs + gradInputs + gradParams + backwardPeak);
}

int64_t ChunkPlan::floor() const {
  return outputs + gradOutputs + gradInputs + gradParams + kept;
}

namespace {

llvm::Error fail(const llvm::Twine &message) {
  return llvm::createStringError(llvm::inconvertibleErrorCode(), message);
}

/// A compiled part's plan and its interface.
struct Part {
  driver::MemoryPlan plan;
  driver::Interface interface;
};

/// Compiles the chunk form's `which` part of `cellIR` (kernels.json only)
/// and plans it over `steps` x `rows`.
llvm::Expected<Part> planPart(mlir::ModuleOp cellIR, llvm::StringRef which,
                              llvm::StringRef dtype, int64_t steps, int64_t rows,
                              const driver::Recompute &mode) {
  mlir::OwningOpRef<mlir::ModuleOp> module = cellIR.clone();
  if (llvm::Error e = takeChunkPart(*module, which))
    return std::move(e);
  auto package = buildCpuPackage(*module, PipelineOptions(), dtype, "", /*lower=*/false);
  if (!package)
    return package.takeError();
  driver::PackageInfo info;
  if (llvm::Error e = errorOf(driver::parsePackage(package->json(), "(chunk plan)", info)))
    return std::move(e);
  Part part;
  part.interface = info.interface;
  if (llvm::Error e = errorOf(
          driver::SequenceDriver::plan(info.interface, steps, rows, mode, part.plan)))
    return std::move(e);
  return part;
}

/// The cell's split, on its IR after cell-split-projections.
struct Analysed {
  mlir::OwningOpRef<mlir::ModuleOp> module;
  DefOp def;
  ChunkwiseSplit split;
};

llvm::Expected<Analysed> analyse(mlir::ModuleOp cellIR) {
  Analysed a;
  a.module = cellIR.clone();
  mlir::PassManager pm(a.module->getContext());
  buildPipeline(pm, Stage::Split);
  if (mlir::failed(pm.run(*a.module)))
    return fail("the passes failed");
  auto defs = a.module->getOps<DefOp>();
  if (defs.empty())
    return fail("no cell");
  a.def = *defs.begin();
  a.split = analyzeChunkwise(a.def);
  return a;
}

/// Why the chunk form's kernels do not run the cell ("": they do).
std::string notPlanned(const Analysed &a) {
  DefOp def = a.def;
  if (!a.split.qualifies())
    return ("cell '" + def.getSymName() +
            "' has no chunkwise form (cellc --emit=chunkwise says why)")
        .str();
  for (const LinearState &s : a.split.states)
    if (s.reason.empty() && chunkTemplateOf(s, a.split) == ChunkTemplate::None)
      return ("state " + s.name +
              " runs the generic core (torch's reverse mode): the plan covers the "
              "kernel templates only (cellc --emit=chunkwise)")
          .str();
  return "";
}

int64_t width(mlir::Value v) {
  return llvm::cast<mlir::ShapedType>(v.getType()).getNumElements();
}

} // namespace

bool cellc::jit::chunkFormExpected(mlir::ModuleOp cellIR, int64_t steps, int64_t chunk,
                                   std::string &why) {
  auto analysed = analyse(cellIR);
  if (!analysed) {
    why = llvm::toString(analysed.takeError());
    return false;
  }
  why = notPlanned(*analysed);
  if (!why.empty())
    return false;
  int64_t L = chunk > 0 ? chunk : defaultChunkLength(steps);
  if (steps < kAutoMinChunks * L) {
    why = llvm::formatv("T = {0} is under {1} chunks of {2} steps", steps, kAutoMinChunks, L);
    return false;
  }
  why = llvm::formatv("every linear state's core runs the chunk kernels, over {0} chunks of "
                      "{1} steps",
                      (steps + L - 1) / L, L);
  return true;
}

llvm::Expected<ChunkPlan> cellc::jit::planChunkForm(mlir::ModuleOp cellIR,
                                                    llvm::StringRef dtype, int64_t T,
                                                    int64_t B,
                                                    const driver::Recompute &mode,
                                                    int64_t chunk) {
  if (T < 1 || B < 1)
    return fail(llvm::formatv("a plan needs T >= 1 steps and B >= 1 rows; got T={0}, B={1}",
                              T, B));
  if (dtype != "f32" && dtype != "f64")
    return fail("the chunk form runs float32 and float64 cells, not " + dtype);
  const int64_t bytes = dtype == "f64" ? 8 : 4;
  const int64_t L = chunk > 0 ? chunk : defaultChunkLength(T);
  const int64_t NC = (T + L - 1) / L;

  auto analysed = analyse(cellIR);
  if (!analysed)
    return analysed.takeError();
  DefOp def = analysed->def;
  const ChunkwiseSplit &analysis = analysed->split;
  if (std::string why = notPlanned(*analysed); !why.empty())
    return fail(why);
  llvm::DenseMap<mlir::Value, int64_t> ids = chunkwiseIds(def);

  // The compiled parts: without a state they run as one step over T * B rows.
  bool steppedBefore = !analysis.gateOnlyStates.empty();
  auto prologue = planPart(cellIR, "prologue", dtype, steppedBefore ? T : 1,
                           steppedBefore ? B : T * B, mode);
  if (!prologue)
    return prologue.takeError();
  std::optional<Part> epilogue;
  if (analysis.epilogueOps > 0) {
    bool steppedAfter = !analysis.postStates.empty();
    auto built = planPart(cellIR, "epilogue", dtype, steppedAfter ? T : 1,
                          steppedAfter ? B : T * B, mode);
    if (!built)
      return built.takeError();
    epilogue = std::move(*built);
  }

  ChunkPlan plan;
  plan.chunk = L;
  const int64_t rows = T * B;
  // The prologue's outputs by id ("v<id>"), and those something keeps.
  llvm::DenseMap<int64_t, int64_t> outputWidth;
  for (const driver::Slot &s : prologue->interface.outputs)
    outputWidth[std::stoll(s.name.substr(1))] = s.shape[0];
  llvm::DenseSet<int64_t> keptOutputs;
  auto isOutput = [&](mlir::Value v) { return outputWidth.count(ids.lookup(v)) != 0; };
  auto keep = [&](mlir::Value v) {
    if (isOutput(v))
      keptOutputs.insert(ids.lookup(v));
  };
  int64_t allOutputs = 0;
  for (auto [id, w] : outputWidth)
    allOutputs += rows * w * bytes;

  // The cores: each state's arrays of its own (kept, or made and dropped)
  // and the gradients its backward makes.
  int64_t coreKept = 0, coreMade = 0, coreGrads = 0, readsBytes = 0;
  auto array = [&](int64_t w, bool kept) {
    (kept ? coreKept : coreMade) += rows * w * bytes;
  };
  for (const LinearState &s : analysis.states) {
    if (!s.reason.empty())
      continue;
    const int64_t H = s.heads ? s.dims[0] : 1;
    const int64_t K = s.heads ? s.dims[1] : s.dims[0];
    const int64_t V = s.oneColumn ? 1 : s.dims.back();
    ChunkTemplate t = chunkTemplateOf(s, analysis);
    // The largest arrays in long double first: no count that wraps.
    long double biggest = (long double)B * H * NC * bytes * std::max(K * V, L * L) *
                          std::max<size_t>(1, s.reads.size());
    if (biggest + (long double)rows * H * std::max(K, V) * bytes > 4e18L)
      return fail(llvm::formatv("the sizes overflow: the chunk form's arrays for state {0} "
                                "at T = {1}, B = {2} are more bytes than int64 counts",
                                s.name, T, B));
    // A product of factors keeps them and each partial product; one factor
    // that is a prologue output as it is (varying along every dim the array
    // has) is a view of it.
    auto factors = [&](llvm::ArrayRef<LinearFactor> list, int64_t w, int64_t dims) {
      if (list.size() == 1 && isOutput(list[0].vector) &&
          llvm::count(list[0].varies, true) == dims) {
        keep(list[0].vector);
        return;
      }
      for (const LinearFactor &f : list)
        keep(f.vector);
      for (size_t i = 2; i < list.size(); ++i)
        array(w, true);
      array(w, true);
    };
    int64_t dimsHK = s.heads ? 2 : 1;
    // The gate's log: a row gate exp(l) with l a prologue output is l; any
    // other is spread over the core's rows (a copy), log(g) keeping g.
    auto logGate = [&](int64_t w, int64_t dims) {
      if (s.gates.size() == 1) {
        mlir::Operation *op = s.gates[0].vector.getDefiningOp();
        if (auto e = llvm::dyn_cast_or_null<ExpOp>(op))
          if (isOutput(e.getOperand()) && llvm::count(s.gates[0].varies, true) == dims) {
            keep(e.getOperand());
            return;
          }
      }
      for (const LinearFactor &f : s.gates)
        if (!llvm::isa_and_nonnull<ExpOp>(f.vector.getDefiningOp()))
          keep(f.vector);
      array(w, true);
    };
    llvm::SmallVector<const LinearRead *> used;
    for (const LinearRead &r : s.reads)
      if (readUsedOutsideCore(r, analysis))
        used.push_back(&r);
    if (t == ChunkTemplate::Delta) {
      logGate(H, s.heads ? 1 : 0);
      // beta: a product begun from one, each partial product an array
      // (spread from one where there is no factor); the key and the target
      // as they are.
      for (size_t i = 1; i < s.deltaScales.size(); ++i)
        keep(s.deltaScales[i].vector);
      for (size_t i = 0; i < std::max<size_t>(1, s.deltaScales.size()); ++i)
        array(H, true);
      keep(s.deltaKey);
      keep(s.deltaTarget);
      coreGrads += rows * (2 * H + H * K + H * V) * bytes;
    } else {
      logGate(H * K, dimsHK);
      const LinearSource &src = s.sources[0];
      factors(src.keys, H * K, dimsHK);
      llvm::SmallVector<LinearFactor> values(src.values);
      values.append(src.scales.begin(), src.scales.end());
      if (values.empty())
        array(H * V, true); // ones spread over the rows
      else
        factors(values, H * V, s.oneColumn ? (s.heads ? 1 : 0) : dimsHK);
      if (src.negated)
        array(H * V, true);
      // The pair weights of every chunk, per read.
      coreKept += B * H * NC * (int64_t)used.size() * L * L * bytes;
      coreGrads += rows * (2 * H * K + H * V) * bytes;
    }
    // The state at each chunk's start.
    coreKept += B * H * NC * K * V * bytes;
    for (const LinearRead *r : used) {
      factors(r->queries, H * K, dimsHK);
      coreGrads += rows * H * K * bytes;
      // A scaled read keeps the core's result and makes the product.
      if (!r->scales.empty()) {
        array(H * V, true);
        for (const LinearFactor &f : r->scales)
          keep(f.vector);
      }
      readsBytes += rows * H * V * bytes;
    }
  }

  // The rest reads the reads and prologue outputs, and keeps them.
  int64_t epilogueInputs = 0;
  if (epilogue) {
    for (const driver::Slot &s : epilogue->interface.inputs) {
      int64_t id = std::stoll(s.name.substr(1));
      epilogueInputs += rows * s.shape[0] * bytes;
      if (outputWidth.count(id))
        keptOutputs.insert(id);
    }
  }
  int64_t between = 0;
  for (int64_t id : keptOutputs)
    between += rows * outputWidth[id] * bytes;
  // The reads the rest keeps (its inputs that are no prologue output).
  int64_t readsKept = 0;
  if (epilogue)
    for (const driver::Slot &s : epilogue->interface.inputs)
      if (!outputWidth.count(std::stoll(s.name.substr(1))))
        readsKept += rows * s.shape[0] * bytes;

  const driver::MemoryPlan &pre = prologue->plan;
  plan.prologueKept = pre.driver.kept;
  plan.epilogueKept = epilogue ? epilogue->plan.driver.kept : 0;
  plan.betweenKept = between + readsKept;
  plan.coreKept = coreKept;
  plan.kept = plan.prologueKept + plan.epilogueKept + plan.betweenKept + plan.coreKept;

  // The caller's buffers: the cell's inputs, params, outputs, final states.
  for (mlir::Value v : def.getInputs())
    plan.gradInputs += rows * width(v) * bytes;
  def.walk([&](ParamOp p) { plan.gradParams += width(p.getResult()) * bytes; });
  for (mlir::Value v : def.getYield().getOutputs())
    plan.outputs += rows * width(v) * bytes;
  plan.gradOutputs = plan.outputs;
  for (mlir::Value v : def.getStates())
    plan.finalStates += B * width(v) * bytes;

  // Forward: the prologue's own peak with its outputs; the cores beside
  // what the prologue keeps; the rest's own peak beside all that is kept.
  int64_t preOwn = pre.driver.forwardPeak;
  int64_t cores = pre.driver.kept + allOutputs + coreKept + coreMade + readsBytes;
  int64_t rest = epilogue ? plan.kept - plan.epilogueKept + epilogue->plan.driver.forwardPeak
                          : 0;
  plan.forwardPeak = std::max({preOwn + allOutputs, cores, rest});
  // Backward: the rest's backward beside everything kept, with its inputs'
  // gradients; the cores' with the reads' and their own gradients; the
  // prologue's with its outputs' gradients.
  int64_t restBack =
      epilogue ? plan.kept - plan.epilogueKept + epilogue->plan.driver.backwardPeak +
                     epilogueInputs
               : 0;
  int64_t coreBack = plan.kept - plan.epilogueKept + epilogueInputs + coreGrads;
  int64_t preBack = pre.driver.backwardPeak + allOutputs;
  plan.backwardPeak = std::max({restBack, coreBack, preBack});
  return plan;
}

llvm::Error cellc::jit::printChunkMemoryPlan(mlir::ModuleOp cellIR, int64_t steps,
                                             int64_t batch, int64_t chunk,
                                             llvm::raw_ostream &os) {
  auto def = *cellIR.getOps<DefOp>().begin();
  mlir::Type element =
      llvm::cast<mlir::RankedTensorType>(def.getStates()[0].getType()).getElementType();
  if (!element.isF32() && !element.isF64())
    return fail("the chunk form runs float32 and float64 cells");
  llvm::StringRef dtype = element.isF32() ? "f32" : "f64";
  const char *modes[] = {"none", "full", "chunk:16", "chunk:64"};
  ChunkPlan plans[4];
  for (int m = 0; m < 4; ++m) {
    auto plan = planChunkForm(cellIR, dtype, steps, batch,
                              *driver::Recompute::parse(modes[m]), chunk);
    if (!plan)
      return plan.takeError();
    plans[m] = *plan;
  }
  auto mib = [](int64_t bytes) { return llvm::formatv("{0,9:F1}", bytes / 1048576.0); };
  os << llvm::formatv("the chunk form (chunks of {0} steps): a training step of T = {1} "
                      "steps x B = {2} rows, MiB (jit::planChunkForm):\n",
                      plans[0].chunk, steps, batch);
  os << "  mode            kept  fwd peak  bwd peak      peak     floor   prologue   "
        "core  between  epilogue\n";
  for (int m = 0; m < 4; ++m) {
    const ChunkPlan &p = plans[m];
    os << llvm::formatv("  {0,-10} {1} {2} {3} {4} {5} {6}{7}{8}{9}\n", modes[m],
                        mib(p.kept), mib(p.forwardPeak), mib(p.backwardPeak), mib(p.peak()),
                        mib(p.floor()), mib(p.prologueKept), mib(p.coreKept),
                        mib(p.betweenKept), mib(p.epilogueKept));
  }
  os << "  kept: what forward keeps for backward: the compiled prologue's and epilogue's "
        "own (their recompute mode),\n"
        "    the core's (each chunk's starting state, the pair weights, the gates, keys "
        "and values it copies) and the arrays\n"
        "    between the parts (the prologue's outputs the core and the rest read, the "
        "reads the rest takes);\n"
        "  peaks as the step form's table counts them; without resets or lengths\n";
  return llvm::Error::success();
}
