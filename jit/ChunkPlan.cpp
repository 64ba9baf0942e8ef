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

namespace {

llvm::Error fail(const llvm::Twine &message) {
  return llvm::createStringError(llvm::inconvertibleErrorCode(), message);
}

/// A compiled part of the chunk form: its kernels' interface, and whether
/// it steps states (else it runs as one step over all T * B rows).
struct Part {
  driver::Interface interface;
  bool stepped = false;
};

/// Compiles the chunk form's `which` part of `cellIR` (kernels.json only).
llvm::Expected<Part> compilePart(mlir::ModuleOp cellIR, llvm::StringRef which,
                                 llvm::StringRef dtype, bool stepped) {
  mlir::OwningOpRef<mlir::ModuleOp> module = cellIR.clone();
  if (llvm::Error e = takeChunkPart(*module, which))
    return std::move(e);
  auto interface = kernelInterface(*module, PipelineOptions(), dtype);
  if (!interface)
    return interface.takeError();
  return Part{std::move(*interface), stepped};
}

/// The id of a part's slot, named v<id> after chunkwiseIds.
int64_t idOf(const driver::Slot &slot) { return std::stoll(slot.name.substr(1)); }

/// The cell's split, on its IR after cell-split-projections.
struct Analysed {
  mlir::OwningOpRef<mlir::ModuleOp> module;
  DefOp def;
  ChunkwiseSplit split;
};

llvm::Expected<Analysed> analyse(mlir::ModuleOp cellIR) {
  Analysed a;
  a.module = cellIR.clone();
  if (llvm::Error e = runToStage(*a.module, Stage::Split))
    return std::move(e);
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

llvm::Expected<std::vector<ChunkPlan>>
cellc::jit::planChunkForm(mlir::ModuleOp cellIR, llvm::StringRef dtype, int64_t T, int64_t B,
                          llvm::ArrayRef<driver::Recompute> modes, int64_t chunk) {
  if (T < 1 || B < 1)
    return fail(llvm::formatv("a plan needs T >= 1 steps and B >= 1 rows; got T={0}, B={1}",
                              T, B));
  int64_t rows;
  if (llvm::MulOverflow(T, B, rows))
    return fail(llvm::formatv("the sizes overflow: T = {0} steps of B = {1} rows are more "
                              "rows than int64 counts",
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
  const int64_t blockArgs = def.getBody().front().getNumArguments();

  // The compiled parts, once; their driver plans in each mode first: they
  // check that the sizes' bytes fit int64.
  auto prologue = compilePart(cellIR, "prologue", dtype, !analysis.gateOnlyStates.empty());
  if (!prologue)
    return prologue.takeError();
  std::optional<Part> epilogue;
  if (analysis.epilogueOps > 0) {
    auto built = compilePart(cellIR, "epilogue", dtype, !analysis.postStates.empty());
    if (!built)
      return built.takeError();
    epilogue = std::move(*built);
  }
  auto planPart = [&](const Part &part, const driver::Recompute &mode,
                      driver::MemoryPlan &out) {
    return errorOf(driver::SequenceDriver::plan(part.interface, part.stepped ? T : 1,
                                                part.stepped ? B : rows, mode, out));
  };
  std::vector<driver::MemoryPlan> prePlans(modes.size()), postPlans(modes.size());
  for (size_t m = 0; m < modes.size(); ++m) {
    if (llvm::Error e = planPart(*prologue, modes[m], prePlans[m]))
      return std::move(e);
    if (epilogue)
      if (llvm::Error e = planPart(*epilogue, modes[m], postPlans[m]))
        return std::move(e);
  }

  // What does not depend on the mode. The prologue's outputs by id, and
  // those something keeps.
  llvm::DenseMap<int64_t, int64_t> outputWidth;
  for (const driver::Slot &s : prologue->interface.outputs)
    outputWidth[idOf(s)] = s.shape[0];
  llvm::DenseSet<int64_t> keptOutputs;
  auto isOutput = [&](mlir::Value v) { return outputWidth.count(ids.lookup(v)) != 0; };
  auto keep = [&](mlir::Value v) {
    if (isOutput(v))
      keptOutputs.insert(ids.lookup(v));
  };
  int64_t allOutputs = 0;
  for (auto [id, w] : outputWidth)
    allOutputs += rows * w * bytes;

  // The cores: each state's arrays of its own (each kept by the next op or
  // the core) and the gradients its backward makes.
  int64_t coreKept = 0, coreGrads = 0, readsBytes = 0;
  auto array = [&](int64_t w) { coreKept += rows * w * bytes; };
  for (const LinearState &s : analysis.states) {
    if (!s.reason.empty())
      continue;
    const int64_t H = s.heads ? s.dims[0] : 1;
    const int64_t K = s.heads ? s.dims[1] : s.dims[0];
    const int64_t V = s.oneColumn ? 1 : s.dims.back();
    // The largest arrays in long double first: no count that wraps.
    long double biggest = (long double)B * H * NC * bytes *
                          std::max((long double)K * V, (long double)L * L) *
                          std::max<size_t>(1, s.reads.size());
    if (biggest + (long double)rows * H * std::max(K, V) * bytes > 4e18L)
      return fail(llvm::formatv("the sizes overflow: the chunk form's arrays for state {0} "
                                "at T = {1}, B = {2} are more bytes than int64 counts",
                                s.name, T, B));
    // The width of a product of factors: the state's dims any of them varies along.
    auto productWidth = [&](llvm::ArrayRef<LinearFactor> list) {
      int64_t w = 1;
      for (size_t d = 0; d < s.dims.size(); ++d)
        if (llvm::any_of(list, [&](const LinearFactor &f) { return f.varies[d]; }))
          w *= s.dims[d];
      return w;
    };
    // A product of `list` as _factor_product and the core make it: one
    // prologue output that varies along each of the array's `dims` is a
    // view of it; else the product is an array `w` wide (a copy where one
    // factor is spread), each partial product kept by the next and the
    // factors by the products. Negated (neg keeps nothing): a view's
    // negation is an array; a product's takes the last product's place.
    auto product = [&](llvm::ArrayRef<LinearFactor> list, int64_t w, int64_t dims,
                       bool negated = false) {
      if (list.size() == 1 && isOutput(list[0].vector) &&
          llvm::count(list[0].varies, true) == dims) {
        negated ? array(w) : keep(list[0].vector);
        return;
      }
      if (list.size() > 1)
        for (const LinearFactor &f : list)
          keep(f.vector);
      for (size_t i = 2; i < list.size(); ++i)
        array(productWidth(list.take_front(i)));
      array(w);
    };
    int64_t dimsHK = s.heads ? 2 : 1;
    // The gate's log: a gate exp(l) with l a prologue output as it is is l;
    // any other is spread over the core's rows (an array), log(g) keeping g.
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
      array(w);
    };
    llvm::SmallVector<const LinearRead *> used;
    for (const LinearRead &r : s.reads)
      if (readUsedOutsideCore(r, analysis))
        used.push_back(&r);
    if (chunkTemplateOf(s, analysis) == ChunkTemplate::Delta) {
      logGate(H, s.heads ? 1 : 0);
      // beta: a product begun from one, each partial product an array
      // (spread from one where there is no factor); the key and the target
      // as they are.
      for (size_t i = 1; i < s.deltaScales.size(); ++i)
        keep(s.deltaScales[i].vector);
      for (size_t i = 0; i < std::max<size_t>(1, s.deltaScales.size()); ++i)
        array(H);
      keep(s.deltaKey);
      keep(s.deltaTarget);
      coreGrads += rows * (2 * H + H * K + H * V) * bytes;
    } else {
      logGate(H * K, dimsHK);
      const LinearSource &src = s.sources[0];
      product(src.keys, H * K, dimsHK);
      llvm::SmallVector<LinearFactor> values(src.values);
      values.append(src.scales.begin(), src.scales.end());
      product(values, H * V, s.oneColumn ? dimsHK - 1 : dimsHK, src.negated);
      // The pair weights of every chunk, per read.
      coreKept += B * H * NC * (int64_t)used.size() * L * L * bytes;
      coreGrads += rows * (2 * H * K + H * V) * bytes;
    }
    // The state at each chunk's start.
    coreKept += B * H * NC * K * V * bytes;
    for (const LinearRead *r : used) {
      product(r->queries, H * K, dimsHK);
      coreGrads += rows * H * K * bytes;
      // A scaled read keeps the core's result, and its scale (a product
      // kept by the one that scales) is made as keys and values are.
      if (!r->scales.empty()) {
        array(H * V);
        for (const LinearFactor &f : r->scales)
          keep(f.vector);
        for (size_t i = 2; i <= r->scales.size(); ++i)
          array(productWidth(llvm::ArrayRef(r->scales).take_front(i)));
      }
      readsBytes += rows * H * V * bytes;
    }
  }

  // The rest keeps its inputs: the reads and the prologue's outputs it
  // reads (the cell's own inputs are the caller's).
  int64_t epilogueInputs = 0, readsKept = 0;
  if (epilogue)
    for (const driver::Slot &s : epilogue->interface.inputs) {
      int64_t id = idOf(s), b = rows * s.shape[0] * bytes;
      epilogueInputs += b;
      if (outputWidth.count(id))
        keptOutputs.insert(id);
      else if (id >= blockArgs)
        readsKept += b;
    }
  int64_t between = readsKept;
  for (int64_t id : keptOutputs)
    between += rows * outputWidth[id] * bytes;
  // Where nothing comes after the core, its reads are the cell's outputs.
  if (!epilogue)
    readsBytes = 0;

  // The caller's buffers: the cell's inputs, params, outputs, final states.
  driver::MemoryPlan caller;
  for (mlir::Value v : def.getInputs())
    caller.gradInputs += rows * width(v) * bytes;
  def.walk([&](ParamOp p) { caller.gradParams += width(p.getResult()) * bytes; });
  for (mlir::Value v : def.getYield().getOutputs())
    caller.outputs += rows * width(v) * bytes;
  caller.gradOutputs = caller.outputs;
  for (mlir::Value v : def.getStates())
    caller.finalStates += B * width(v) * bytes;

  std::vector<ChunkPlan> plans;
  for (size_t m = 0; m < modes.size(); ++m) {
    const driver::MemoryStats &pre = prePlans[m].driver;
    const driver::MemoryStats *post = epilogue ? &postPlans[m].driver : nullptr;
    ChunkPlan plan;
    plan.chunk = L;
    plan.prologueKept = pre.kept;
    plan.epilogueKept = post ? post->kept : 0;
    plan.betweenKept = between;
    plan.coreKept = coreKept;
    plan.total = caller;
    driver::MemoryStats &own = plan.total.driver;
    own.kept = plan.prologueKept + plan.epilogueKept + plan.betweenKept + plan.coreKept;
    int64_t beforeRest = own.kept - plan.epilogueKept;
    // Forward: the prologue's own peak with its outputs; the cores beside
    // what the prologue keeps; the rest's own peak beside all that is kept.
    own.forwardPeak = std::max({pre.forwardPeak + allOutputs,
                                pre.kept + allOutputs + coreKept + readsBytes,
                                post ? beforeRest + post->forwardPeak : 0});
    // Backward: the rest's backward beside everything kept, with its
    // inputs' gradients; the cores' with the reads' and their own
    // gradients; the prologue's with its outputs' gradients.
    own.backwardPeak =
        std::max({post ? beforeRest + post->backwardPeak + epilogueInputs : 0,
                  beforeRest + epilogueInputs + coreGrads, pre.backwardPeak + allOutputs});
    plans.push_back(plan);
  }
  return plans;
}

llvm::Error cellc::jit::printChunkMemoryPlan(mlir::ModuleOp cellIR, int64_t steps,
                                             int64_t batch, int64_t chunk,
                                             llvm::raw_ostream &os) {
  auto def = *cellIR.getOps<DefOp>().begin();
  mlir::Type element =
      llvm::cast<mlir::RankedTensorType>(def.getStates()[0].getType()).getElementType();
  if (!element.isF32() && !element.isF64())
    return fail("the chunk form runs float32 and float64 cells");
  llvm::SmallVector<driver::Recompute> modes;
  for (const char *mode : kPlanModes)
    modes.push_back(*driver::Recompute::parse(mode));
  auto plans = planChunkForm(cellIR, element.isF32() ? "f32" : "f64", steps, batch, modes,
                             chunk);
  if (!plans)
    return plans.takeError();
  auto mib = [](int64_t bytes) { return llvm::formatv("{0,9:F1}", bytes / 1048576.0); };
  os << llvm::formatv("the chunk form (chunks of {0} steps): a training step of T = {1} "
                      "steps x B = {2} rows, MiB (jit::planChunkForm):\n",
                      plans->front().chunk, steps, batch);
  os << "  mode            kept  fwd peak  bwd peak      peak     floor   prologue   "
        "core  between  epilogue\n";
  for (size_t m = 0; m < plans->size(); ++m) {
    const ChunkPlan &p = (*plans)[m];
    const driver::MemoryPlan &t = p.total;
    os << llvm::formatv("  {0,-10} {1} {2} {3} {4} {5} {6}{7}{8}{9}\n", kPlanModes[m],
                        mib(t.driver.kept), mib(t.driver.forwardPeak),
                        mib(t.driver.backwardPeak), mib(t.peak()), mib(t.floor()),
                        mib(p.prologueKept), mib(p.coreKept), mib(p.betweenKept),
                        mib(p.epilogueKept));
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
