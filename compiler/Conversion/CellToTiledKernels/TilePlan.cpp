//===- TilePlan.cpp - The tile and memory budget of a tiled kernel ---------===//
//
// What a tiled kernel's buffers take, computed before any is built: the
// phases' materialized values, the products computed whole, the states (two
// slots; in backward also the previous states, the gradients' slots and the
// accumulators) and the param-gradient accumulators, per batch row. The tile
// is the largest that fits the shared-memory limit; the persistent strategy
// takes the fewest CTAs whose weight slices fit. The kernel's figures come
// from here, and the pass checks what it allocated against them. A step
// that keeps its heads apart (stepHeads) runs whole heads a CTA instead,
// its buffers in the CTA's shared memory.
//
//===----------------------------------------------------------------------===//

#include "compiler/Conversion/CellToTiledKernels/TiledBuilder.h"

#include <algorithm>
#include <optional>

namespace mlir::cell {

bool onTensorCores(Operation *op, cellc::Precision precision) {
  if (precision == cellc::Precision::Ieee || !isa<MatvecOp, VecmatOp>(op))
    return false;
  // Each block of a block-diagonal weight must fill the tiles itself.
  ProductBlocks b = productBlocks(op);
  int64_t k = precision == cellc::Precision::Bf16 ? 16 : 8;
  return b.outs % 16 == 0 && b.ins % k == 0;
}

namespace {

/// How a tile's CTAs hold the recurrent weights: how many CTAs, the dynamic
/// shared memory each takes, and the products whose weights stay in global
/// memory.
struct SliceFit {
  int64_t ctas = 0, sharedBytes = 0;
  SmallPtrSet<Operation *, 4> uncached;
};

/// The fewest CTAs (from `options.ctas`, or 1..4096, at most
/// `options.maxCtas`) whose slices of the recurrent weights of `matvecs`,
/// with the per-thread partial products, fit in workgroup memory, each
/// slice with no more rows than threads. Where none fit under `maxCtas`,
/// `maxCtas` CTAs, caching the products in order while they fit and
/// leaving the rest in global memory. Nothing where no count fits.
std::optional<SliceFit> fitSlices(ArrayRef<Operation *> matvecs, int64_t tile,
                                  int64_t bytes, const TiledOptions &options) {
  auto padded = [](int64_t n) { return (n + 15) / 16 * 16; };
  bool gpu = options.gpu;
  int64_t partialBytes = gpu ? padded(options.threads * tile * bytes) : 0;
  // The shared bytes of `op`'s slice over `g` CTAs, or nothing where its
  // slice has more rows than threads.
  auto sliceBytes = [&](Operation *op, int64_t g) -> std::optional<int64_t> {
    int64_t slice = (sizeOf(op->getResult(0)) + g - 1) / g;
    bool mma = gpu && onTensorCores(op, options.precision);
    if (mma)
      slice = (slice + 15) / 16 * 16;
    if (slice > options.threads)
      return std::nullopt;
    // bf16 tensor cores keep a bf16 copy (Persistent.cpp, cachedType).
    int64_t width = mma && options.precision == cellc::Precision::Bf16 ? 2 : bytes;
    return padded(slice * (sizeOf(op->getOperand(1)) + 1) * width);
  };
  auto sharedFor = [&](int64_t g) -> std::optional<int64_t> {
    int64_t total = partialBytes;
    for (Operation *op : matvecs) {
      std::optional<int64_t> b = sliceBytes(op, g);
      if (!b)
        return std::nullopt;
      total += *b;
    }
    if (total > options.sharedLimit)
      return std::nullopt;
    return total;
  };
  int64_t most = options.maxCtas > 0 ? std::min<int64_t>(options.maxCtas, 4096) : 4096;
  for (int64_t g = options.ctas > 0 ? options.ctas : 1; g <= most; ++g) {
    if (auto fit = sharedFor(g))
      return SliceFit{g, *fit, {}};
    if (options.ctas > 0)
      break;
  }
  if (options.maxCtas <= 0 || options.ctas > 0 || !gpu)
    return std::nullopt;
  // Capped: what fits of `most` CTAs' slices stays on chip; the rest of
  // the products read their weights from global memory. The products that
  // run in both variants first: a replayed product runs only where the
  // gates were not saved.
  SliceFit fit{most, partialBytes, {}};
  SmallVector<Operation *> order(matvecs.begin(), matvecs.end());
  std::stable_partition(order.begin(), order.end(),
                        [](Operation *op) { return !op->getParentOfType<RestoreOp>(); });
  for (Operation *op : order) {
    std::optional<int64_t> b = sliceBytes(op, most);
    if (b && !onTensorCores(op, options.precision) &&
        fit.sharedBytes + *b <= options.sharedLimit)
      fit.sharedBytes += *b;
    else if (!onTensorCores(op, options.precision))
      fit.uncached.insert(op);
    else
      return std::nullopt;
  }
  return fit;
}

/// The leading dim that all the states of `def` share, when one of them is
/// declared with several dims (IRGen's `state_dims`); 0 otherwise.
int64_t stateHeads(DefOp def) {
  auto dims = def->getAttrOfType<DictionaryAttr>("state_dims");
  if (!dims || dims.empty())
    return 0;
  int64_t heads = 0;
  for (auto [name, state] : llvm::zip(def.getStateNames().getAsValueRange<StringAttr>(),
                                      def.getStates())) {
    int64_t lead = sizeOf(state);
    if (auto declared = dims.getAs<DenseI64ArrayAttr>(name))
      lead = declared[0];
    if (heads > 0 && lead != heads)
      return 0;
    heads = lead;
  }
  return heads;
}

/// The fewest heads a CTA takes so that its part of the largest state gives
/// each of `threads` threads an element, among the divisors of `heads`.
int64_t headsPerCta(DefOp def, int64_t heads, int64_t threads) {
  int64_t largest = 0;
  for (Value s : def.getStates())
    largest = std::max(largest, sizeOf(s) / heads);
  for (int64_t g = 1; g < heads; ++g)
    if (heads % g == 0 && largest * g >= threads)
      return g;
  return heads;
}

} // namespace

int64_t stepHeads(DefOp def, Block &body, const PhasePlan &phases, bool backward) {
  int64_t heads = stateHeads(def);
  if (heads == 0)
    return 0;
  // Values any CTA can compute at any element: the params, constants,
  // projections, inputs and output gradients (read from global memory), and
  // what only they reach, unless a buffer holds it (a CTA's buffers hold its
  // heads only).
  DenseSet<Value> anywhere;
  unsigned numInputs = def.getInputs().size(), numStates = def.getStates().size();
  unsigned numOutputs = def.getOutputNames().size();
  for (auto [i, arg] : llvm::enumerate(body.getArguments())) {
    bool state = backward ? (i >= numInputs && i < numInputs + numStates) ||
                                i >= numInputs + numStates + numOutputs
                          : i >= numInputs;
    if (phases.materialized.contains(arg) && sizeOf(arg) % heads != 0)
      return 0;
    if (!state && !phases.materialized.contains(arg))
      anywhere.insert(arg);
  }
  // What the step writes out (and a backward step sums over the steps) is
  // split by head too, but for an input's gradient that is zero (not
  // written: backwardItems).
  Operation *terminator = body.getTerminator();
  SmallVector<GradResultAttr> kinds;
  if (auto grad = dyn_cast<func::FuncOp>(body.getParentOp()); grad && backward)
    kinds = gradResultsOf(grad);
  for (auto [r, v] : llvm::enumerate(terminator->getOperands())) {
    bool unwritten = r < kinds.size() &&
                     kinds[r].getKind() == cellc::GradKind::Input && isZeroConstant(v);
    if (!unwritten && sizeOf(v) % heads != 0)
      return 0;
  }
  for (SaveOp save : body.getOps<SaveOp>())
    for (Value v : save.getValues())
      if (sizeOf(v) % heads != 0)
        return 0;
  auto keepsHeads = [&](ArrayRef<int64_t> shape, ArrayRef<int64_t> kept) {
    return !shape.empty() && shape[0] == heads && llvm::is_contained(kept, 0);
  };
  WalkResult walked = body.walk<WalkOrder::PreOrder>([&](Operation *op) {
    if (isa<MatvecOp, VecmatOp, SumOp, ChunkOp, ConcatOp>(op) || PhasePlan::isProduct(op))
      return WalkResult::interrupt();
    if (auto expand = dyn_cast<ExpandOp>(op);
        expand && !keepsHeads(expand.getShape(), expand.getKept()))
      return WalkResult::interrupt();
    if (auto reduce = dyn_cast<ReduceOp>(op);
        reduce && !keepsHeads(reduce.getShape(), reduce.getKept()))
      return WalkResult::interrupt();
    // A restored value counts as computed head by head: replayed, it comes
    // from the step's own values.
    bool fromAnywhere = !isa<RestoreOp>(op);
    for (Value operand : op->getOperands())
      fromAnywhere &= anywhere.contains(operand);
    for (Value result : op->getResults()) {
      if (fromAnywhere && !phases.materialized.contains(result)) {
        anywhere.insert(result);
        continue;
      }
      // Computed head by head: its elements split evenly by head, and each
      // operand read at the same element (an expand or a reduce keeps the
      // heads, checked above) or at any.
      if (sizeOf(result) % heads != 0)
        return WalkResult::interrupt();
      if (!isa<ExpandOp, ReduceOp>(op))
        for (Value operand : op->getOperands())
          if (sizeOf(operand) != sizeOf(result) && !anywhere.contains(operand))
            return WalkResult::interrupt();
    }
    return WalkResult::advance();
  });
  return walked.wasInterrupted() ? 0 : heads;
}

FailureOr<TilePlan> planTile(DefOp def, Block &body, const PhasePlan &phases,
                             const BackwardArgs &args, bool backward,
                             Type element, const TiledOptions &options) {
  bool gpu = options.gpu, persistent = options.persistent;
  TilePlan plan;
  for (Value m : phases.materialized)
    plan.rowElements += sizeOf(m);
  // The products the persistent strategy caches (not block-diagonal ones).
  // With the persistent strategy each of those is a buffer; with a CTA per
  // tile, those on tensor cores.
  SmallVector<Operation *> matvecs;
  body.walk([&](Operation *op) {
    if (!PhasePlan::isProduct(op))
      return;
    bool cached = !productBlocks(op).diagonal;
    if (cached)
      matvecs.push_back(op);
    if (persistent ? cached : gpu && onTensorCores(op, options.precision))
      plan.rowElements += sizeOf(op->getResult(0));
  });
  // Each reduction's one value per row, and two sets of partial sums
  // (TiledBuilder::emitSum): one a warp of a CTA (a thread on the CPU), or
  // of every CTA of the tile (below).
  int64_t sums = 0;
  body.walk([&](SumOp) { ++sums; });
  int64_t partialsPerCta = gpu ? options.threads / 32 : 1;
  plan.rowElements += sums;
  if (sums && !persistent)
    plan.rowElements += 2 * partialsPerCta;
  for (Value s : def.getStates())
    plan.rowElements += (backward ? 5 : 2) * sizeOf(s);
  if (backward)
    for (auto [r, kind] : llvm::enumerate(args.kinds))
      if (kind == cellc::GradKind::Param)
        plan.rowElements += sizeOf(body.getTerminator()->getOperand(r));
  plan.elementBytes = cast<FloatType>(element).getWidth() / 8;
  int64_t bytes = plan.elementBytes;

  // The tile: at most `batch-tile` rows, halved until the workgroup buffers
  // fit. Past 4 rows the per-row accumulators and addresses spill registers
  // on sm_80 and sm_90 (ptxas -v, LSTM and GRU at H=256).
  int64_t tile = options.batchTile > 0 ? options.batchTile : 4;
  int64_t limit = options.sharedLimit;
  while (!persistent && tile > 1 && plan.rowElements * tile * bytes > limit)
    tile /= 2;
  plan.tile = tile;
  if (gpu && !persistent && plan.rowElements * tile * bytes > limit)
    return emitError(def.getLoc())
           << "'" << def.getSymName() << "' needs " << plan.rowElements * tile * bytes
           << " bytes of workgroup memory per CTA for "
           << (backward ? "its backward" : "its forward")
           << " kernel even with one batch row per CTA, over the limit of " << limit
           << "; the persistent strategy splits each step across CTAs, with the "
              "weights in their dynamic shared memory (what cellc chooses when no "
              "strategy is named)";
  if (!persistent)
    return plan;

  // Whole heads a CTA, its buffers in shared memory, if a tile of at least
  // one row fits there (the tile halved as above). A step whose heads mix
  // but that has no weights to cache is one head: a CTA owns its rows whole.
  int64_t heads = gpu ? stepHeads(def, body, phases, backward) : 0;
  if (gpu && heads == 0 && matvecs.empty())
    heads = 1;
  if (heads > 0 && (options.ctas == 0 || heads % options.ctas == 0)) {
    int64_t slices = options.ctas > 0 ? options.ctas
                                      : heads / headsPerCta(def, heads, options.threads);
    // A reduction's two sets of partials, one a warp (only when one CTA
    // owns the rows: stepHeads takes no reductions).
    int64_t perCta = plan.rowElements / slices + (sums ? 2 * partialsPerCta : 0);
    int64_t rows = tile;
    while (rows > 1 && perCta * rows * bytes > limit)
      rows /= 2;
    if (perCta * rows * bytes <= limit) {
      plan.rowElements = perCta * slices;
      plan.tile = rows;
      plan.heads = heads;
      plan.slices = slices;
      plan.dynamicSharedBytes = perCta * rows * bytes;
      return plan;
    }
  }

  auto fit = fitSlices(matvecs, tile, bytes, options);
  if (!fit)
    return emitError(def.getLoc())
           << "'" << def.getSymName() << "': the persistent strategy cannot "
           << "fit " << (backward ? "its backward" : "its forward")
           << " kernel's recurrent weights in "
           << (options.ctas > 0 ? llvm::Twine(options.ctas).str() + " CTAs"
                                : std::string("4096 CTAs or fewer"))
           << " of " << limit << " bytes of workgroup memory each";
  plan.slices = fit->ctas;
  plan.dynamicSharedBytes = fit->sharedBytes;
  plan.uncached = std::move(fit->uncached);
  if (sums)
    plan.rowElements += 2 * plan.slices * partialsPerCta;
  return plan;
}

} // namespace mlir::cell
