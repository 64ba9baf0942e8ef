//===- SequenceDriver.h - One sequence driver for every backend -*- C++ -*-===//
//
// What runs around a cell's kernels, written once: the hoisted projections'
// GEMMs, the forward over chunks, what the forward keeps in each recompute
// mode, the backward's replays and carried gradients, the weight, bias and
// input gradients' GEMMs, resets, and the workspace. It runs over a small
// `Backend` (allocate, launch a kernel, GEMM, column sums, fill, copy, add)
// that the CPU runtime implements with OpenBLAS and the JIT, and the CUDA
// runtime (runtime/cuda/CudaBackend) with cuBLAS, on a GPU or the emulator.
//
// Plain C++17, no LLVM or MLIR: it is compiled into libcellc_runtime, which
// builds on a GPU machine without them. One file a job: SequenceDriver.cpp
// (buffers, a kernel's arguments, launches, checks), Forward.cpp, Step.cpp,
// Kept.cpp (what a forward keeps), Backward.cpp, Profile.cpp and Plan.cpp,
// over what they share (DriverParts.h).
//
//===----------------------------------------------------------------------===//

#ifndef CELLC_RUNTIME_DRIVER_SEQUENCEDRIVER_H
#define CELLC_RUNTIME_DRIVER_SEQUENCEDRIVER_H

#include "dialects/Cell/IR/KernelInterface.h"

#include <algorithm>
#include <array>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace cellc::driver {

/// A failure's message; empty when all went well. True on failure, as
/// llvm::Error is.
class Status {
public:
  Status() = default;
  static Status error(std::string message) {
    Status s;
    s.text = message.empty() ? "unknown error" : std::move(message);
    return s;
  }
  explicit operator bool() const { return !text.empty(); }
  const std::string &message() const { return text; }

private:
  std::string text;
};

/// The element types of the buffers the driver handles.
enum class Element { F32, F64, BF16, U8, I32 };
int64_t bytesOf(Element element);
/// An MLIR element type's name ("f32", "bf16", "i8", ...) as an Element.
std::optional<Element> parseElement(std::string_view name);
/// An Element's name as kernels.json writes it: parseElement's inverse.
const char *elementName(Element element);

/// Memory: a backend's handle (`id`) or a pointer (`data`), or both.
struct Buffer {
  void *data = nullptr;
  int64_t id = -1;
  Element element = Element::F32;
  bool valid() const { return data || id >= 0; }
};

/// Contiguous elements of a buffer, from `offset`, with a shape.
struct View {
  Buffer buffer;
  int64_t offset = 0;
  std::vector<int64_t> shape;

  Element element() const { return buffer.element; }
  int64_t size() const;
  bool valid() const { return buffer.valid(); }
  /// The view `elements` further on, with `shape`.
  View at(int64_t elements, std::vector<int64_t> shape) const;
  /// A pointer to the first element, where the buffer has one.
  void *pointer() const;
};

/// One argument of a kernel launch: a view, or an index (b_begin, b_end).
struct Arg {
  View view;
  std::optional<int64_t> index;
};

/// What the driver asks of a target. Calls happen on one thread, in order.
class Backend {
public:
  virtual ~Backend() = default;
  virtual Status allocate(int64_t elements, Element element, bool zero,
                          Buffer &out) = 0;
  virtual void release(const Buffer &buffer) = 0;
  /// Runs the forward or backward kernel, the variant that saves gates or
  /// the one that replays them, on `args` (in the kernel's order; the last
  /// two are b_begin = 0 and b_end = batch) over `batch` rows.
  virtual Status launch(bool backward, bool saveGates, const std::vector<Arg> &args,
                        int64_t batch) = 0;
  /// How many instances of a kernel a launch over `batch` rows runs at once
  /// (each with its own scratch, and its part of a per-group workspace).
  virtual int64_t instances(int64_t batch) const { return 1; }
  /// How many of a launch's `tiles` batch tiles run at once, each with its
  /// part of the kernel's workspace and barrier words (CUDA's persistent
  /// grids hold what the device keeps resident, and run the rest in turn);
  /// by default all.
  virtual int64_t tilesAtOnce(bool backward, bool saveGates, int64_t batch, int64_t tiles) {
    return tiles;
  }
  /// Row-major `c = op(a) op(b) + beta c`, with leading dimensions; in the
  /// element type of `a`, accumulated and stored in `c`'s.
  virtual Status gemm(bool transA, bool transB, int64_t m, int64_t n, int64_t k,
                      const View &a, int64_t lda, const View &b, int64_t ldb,
                      double beta, const View &c, int64_t ldc) = 0;
  /// Two products that share op(a): `c1 = op(a) op(b1) + beta c1` (n1
  /// columns) and `c2 = op(a) op(b2) + beta c2` (n2), as an LSTM's weight
  /// gradients dW_ih and dW_hh share dG. A backend may run them as one
  /// product that reads op(a) once; by default, two `gemm` calls.
  virtual Status gemmPair(bool transA, bool transB, int64_t m, int64_t n1, int64_t n2,
                          int64_t k, const View &a, int64_t lda, const View &b1, int64_t ldb1,
                          const View &b2, int64_t ldb2, double beta, const View &c1,
                          int64_t ldc1, const View &c2, int64_t ldc2) {
    if (Status e = gemm(transA, transB, m, n1, k, a, lda, b1, ldb1, beta, c1, ldc1))
      return e;
    return gemm(transA, transB, m, n2, k, a, lda, b2, ldb2, beta, c2, ldc2);
  }
  /// `acc[j] += sum over the rows of m[row, j]`.
  virtual Status columnSums(const View &m, int64_t rows, int64_t cols,
                            const View &acc) = 0;
  /// Every row of `m` (`rows x cols`) becomes the sum of `vectors`: zeros
  /// when there are none.
  virtual Status fillRows(const View &m, int64_t rows, int64_t cols,
                          const std::vector<View> &vectors) = 0;
  /// `to = from`, converting the element type; `to += from`.
  virtual Status copy(const View &from, const View &to) = 0;
  virtual Status add(const View &from, const View &to) = 0;
  /// `to = from` transposed: `from` [rows, cols], `to` [cols, rows].
  virtual Status transpose(const View &from, const View &to) = 0;

  // Per-sample lengths, as `lengths` ([B] int32, in a buffer of this
  // backend: `upload`). Each is one pass over its views, whatever T and B.
  /// Copies `bytes` of host memory into `to`, a view of this backend's.
  virtual Status upload(const void *host, int64_t bytes, const View &to) = 0;
  /// Zeros over the rows of `v` ([len, B, n], from step `first` on) past
  /// their sample's length: row (s, b) where lengths[b] <= first + s.
  virtual Status maskPastLengths(const View &v, const View &lengths, int64_t first) = 0;
  /// `to[b] = from[lengths[b] - 1 - t0, b]` ([B, n] from [len, B, n]) for
  /// each sample whose last step is in [t0, t0 + len), converting the
  /// element type; a [B, n] `from` is step t0 = -1 (before the first: the
  /// samples of length 0).
  virtual Status gatherAtLengths(const View &from, int64_t t0, const View &lengths,
                                 const View &to) = 0;
  /// `to[b] += from[b]` ([B, n]) for each sample whose last step is `step`.
  virtual Status addAtLengths(const View &from, const View &lengths, int64_t step,
                              const View &to) = 0;
};

/// A declared input, state, param or output with its bound shape.
struct Slot {
  std::string name;
  std::vector<int64_t> shape;
};

/// A shape as messages print it: `[2, 3]`.
std::string shapeString(const std::vector<int64_t> &shape);

/// The index of the slot called `name`, or -1.
size_t indexOf(const std::vector<Slot> &slots, const std::string &name);

/// One argument of a kernel, as the kernel interface describes it.
struct KernelArg {
  ArgKind kind = ArgKind::Input;
  std::string name, input;
  std::vector<std::string> biases;
  int64_t sameAs = -1;
  bool zero = false;
  /// The memref's shape (-1 for T and B) and element type; empty for an
  /// index.
  std::vector<int64_t> shape;
  std::optional<Element> element;
};

/// A kernel: its arguments, and for the persistent CUDA strategy its tile and
/// workspace per tile; for the CPU's batched kernels (which have a `group`
/// argument), the workspace and barrier words per group of threads.
struct Kernel {
  std::vector<KernelArg> args;
  int64_t batchTile = 1;
  int64_t workspaceBytes = 0;
  int64_t barrierWords = 2;
  /// A profiling build's barrier sites (`pack`, `states`, `phase N
  /// products` ...): after the barrier words of each group, two 32-bit
  /// counters per site and slice, `[site][slice][work, wait]`, for the first
  /// `profileSlices` slices, in cycles over `2^profileShift`.
  std::vector<std::string> profileSites;
  int64_t profileSlices = 0, profileShift = 0;
  /// Whether the workspace has a part per group of threads (the backend's
  /// instances), not per tile.
  bool perGroup() const;
  /// What one instance of the kernel allocates for itself as it runs (the
  /// CPU's tile buffers and packed weights), in the variant that replays
  /// (0) or reads saved gates (1).
  int64_t scratchBytes[2] = {0, 0};
  /// A CUDA kernel's launch: threads per CTA, dynamic shared memory per
  /// CTA, and for the persistent strategy the CTAs per batch tile (0:
  /// batch-tiled, one CTA a tile) and the heads they split (0: one grid
  /// whose CTAs meet at grid barriers, launched cooperatively).
  int64_t threads = 0, dynamicSharedBytes = 0, ctas = 0, heads = 0;
  /// Registers per thread of the kernel in the variant that replays (0) or
  /// reads saved gates (1), as ptxas reported them when the package was
  /// built (-1: not known; the SIMT emulator's device model then counts
  /// none).
  int64_t registers[2] = {-1, -1};
  /// Persistent: the products whose weights a tile's CTAs (capped by
  /// `max-ctas`) cannot hold in shared memory, read from global memory.
  int64_t globalWeights = 0;
  /// How the kernel is organized, where the package says.
  std::optional<Strategy> strategy;
};

/// What the driver knows of a compiled cell: its kernels' interfaces, from
/// which the slots and the projections follow (`finish`).
struct Interface {
  Kernel forward, backward;
  /// The cell's element type (states, params, gradients).
  Element compute = Element::F32;

  std::vector<Slot> inputs, states, params, outputs;
  /// For each state, the output that is the state (`output h` of a state
  /// h: the same values after every step, in the same element type), or -1.
  /// Such an output can be the state's history.
  std::vector<int64_t> stateOutputs;
  /// A projection the driver computes with a GEMM: weight @ input + biases.
  /// `rows` outputs from `cols` inputs; with a block-diagonal weight
  /// `[blocks, rows / blocks, cols / blocks]`, block by block.
  struct Projection {
    size_t weight, input;
    std::vector<size_t> biases;
    int64_t rows, cols, blocks = 1;
    Element element;
  };
  std::vector<Projection> projections;
  int64_t gatesWidth = 0;
  Element storage = Element::F32;
  /// Whether the forward kernel writes each state after its last step in
  /// the compute type (ArgKind::EndState): the next launch starts from
  /// that, not from the history, which may be stored narrower.
  bool endStates = false;

  /// Derives the slots and projections from the forward kernel's
  /// arguments, and checks the two kernels agree.
  Status finish();
};

/// What forward keeps for the backward, named as users know it.
struct Recompute {
  enum class Kind { None, Full, Chunk };
  Kind kind = Kind::None;
  int64_t chunk = 0;
  /// Parses "none", "full" or "chunk:K" (K >= 1): the one parse function.
  static std::optional<Recompute> parse(std::string_view text);
  /// The same, with the one message for a mode it does not take.
  static Status parse(std::string_view text, Recompute &out);
  std::string str() const;
};

/// What forward keeps for backward; it releases its buffers through the
/// backend that made them.
class Saved;
struct SavedDeleter {
  void operator()(Saved *saved) const;
};
using SavedPtr = std::unique_ptr<Saved, SavedDeleter>;
/// The bytes `saved` owns: the states and gates it keeps, not the outputs
/// that it reads as states' histories.
int64_t savedBytes(const Saved &saved);
/// The outputs (their indices) that `saved` reads as states' histories: the
/// caller must keep them alive and unchanged until the backward.
const std::vector<size_t> &savedOutputsRead(const Saved &saved);
/// The steps and batch rows of the forward that made `saved`.
int64_t savedSteps(const Saved &saved);
int64_t savedBatch(const Saved &saved);

/// A sequence as the caller holds it: inputs `[T, B, n]`, params, initial
/// states `[B, n]` (invalid views: zeros), resets `[T, B]` bytes (invalid:
/// none).
struct Sequence {
  std::vector<View> inputs, params, initialStates;
  View resets;
  int64_t steps = 0, batch = 0;
  /// Per-sample lengths, on the host (empty: every sample runs all T steps).
  /// Sample b runs steps 0 .. lengths[b] - 1: its outputs after them are
  /// zero, its final state is its state after its own last step (the initial
  /// state for a length of 0), and the gradients respect both.
  std::vector<int64_t> lengths;
};

/// The bytes the driver holds (what forward keeps, and its scratch) over
/// the calls of a driver.
struct MemoryStats {
  /// What the last forward kept for its backward (savedBytes).
  int64_t kept = 0;
  /// The most the driver held at once during the last forward and the last
  /// backward, kept bytes of every live Saved included.
  int64_t forwardPeak = 0, backwardPeak = 0;
  /// What it holds now: the kept bytes of every live Saved.
  int64_t live = 0;
};

/// What the barriers of a profiling build counted (Kernel::profileSites):
/// for each thread that ran the kernel, the cycles of the host's counter it
/// worked before each site's barrier and the cycles it waited in it, summed
/// over the launches since the profile was reset.
struct PhaseProfile {
  std::vector<std::string> sites;
  struct Thread {
    int64_t group = 0, slice = 0;
    /// [site][0: work, 1: wait]
    std::vector<std::array<uint64_t, 2>> cycles;
  };
  std::vector<Thread> threads;
  int64_t launches = 0;
};

/// What a training step of T x B in a mode holds, from a run of the driver
/// on a backend that allocates nothing (SequenceDriver::plan). The caller's
/// buffers are those the Python layer allocates: the outputs and final
/// states, then for the backward the outputs' gradients and the inputs' and
/// params' gradients.
struct MemoryPlan {
  MemoryStats driver;
  /// Steps per piece: the projections and gradient GEMMs run over this many
  /// steps at a time.
  int64_t pieceSteps = 0;
  int64_t outputs = 0, finalStates = 0, gradOutputs = 0, gradInputs = 0,
          gradParams = 0;
  /// The bytes of the kept states that are outputs (not in `driver.kept`).
  int64_t keptOutputs = 0;
  /// The peak over the step: the larger of the forward's (outputs, final
  /// states, the driver's forward peak) and the backward's (those, the
  /// gradients, the driver's backward peak).
  int64_t peak() const;
  /// What any implementation holds at the end of the step: the outputs,
  /// their gradients, the inputs' and params' gradients, and the kept
  /// states.
  int64_t floor() const;
  /// The plan as the C interfaces give it (cellc_cpu_memory_plan,
  /// cellc_cuda_plan, the compiler's chunk_plan): kept, forward peak,
  /// backward peak, outputs, final states, output gradients, input
  /// gradients, param gradients, kept outputs, piece steps, peak, floor.
  std::array<int64_t, 12> figures() const;
};

/// A buffer a forward keeps for its backward, as a caller that holds it
/// allocates it: `[T, B, width]`, or `[chunks, B, width]` per chunk.
struct KeptBuffer {
  bool perChunk = false;
  int64_t width = 0;
  Element element = Element::F32;
};

/// The weights a backend's step kernels pack into their workspace (the
/// CPU's kernels, through their `packed` argument), kept by that backend: a
/// step asks whether the workspace holds this step's params packed, and says
/// what its launch packed. The driver knows no more of packing than this.
class StepPacking {
public:
  virtual ~StepPacking() = default;
  /// Whether the workspace (the last step's, where `reused`) holds the
  /// weights of `params` packed.
  virtual bool holds(const std::vector<void *> &params, bool reused) const = 0;
  /// What the workspace holds packed after a launch: `params` (empty:
  /// nothing, as while a launch runs or after one failed).
  virtual void packed(std::vector<void *> params) = 0;
};

/// Runs a cell's kernels over sequences on a backend.
class SequenceDriver {
public:
  class Scratch;
  struct Ledger;
  SequenceDriver(Interface cell, std::shared_ptr<Backend> backend);
  ~SequenceDriver();

  const Interface &interface() const { return cell; }

  /// Outputs `[T, B, n]` and final states `[B, n]`; with `saved`, what
  /// `backward` needs in `mode`. With `outputsOutliveSaved`, the caller keeps
  /// the outputs alive and unchanged as long as `saved`: an output that is a
  /// state is then that state's history in `saved`, not a copy.
  /// With `kept` (the buffers `keptLayout` says, in its order), what forward
  /// keeps goes there, the caller's, and `saved` reads them.
  Status forward(const Sequence &seq, const std::vector<View> &outputs,
                 const std::vector<View> &finalStates, Recompute mode,
                 SavedPtr *saved, bool outputsOutliveSaved = false,
                 const std::vector<View> *kept = nullptr);

  /// What a training forward in `mode` keeps beyond the outputs it reads, in
  /// order: each state's history ([T, B, n], none and full; none for a state
  /// that is an output the caller keeps, without lengths) or its value before
  /// each chunk of `mode.chunk` steps (chunk:K); then the gates (none).
  std::vector<KeptBuffer> keptLayout(Recompute mode, bool hasLengths,
                                     bool outputsOutliveSaved) const;
  /// For each state, the output that such a forward keeps as its history
  /// (which the caller must keep unchanged until the backward), or -1.
  std::vector<int64_t> keptOutputs(Recompute mode, bool hasLengths,
                                   bool outputsOutliveSaved) const;

  /// What a forward of `seq` in `mode` kept into the caller's `kept` buffers
  /// (keptLayout's, with the outputs kept by the caller), for `backward`.
  /// Outputs that it does not keep (keptOutputs) may be absent.
  Status adopt(const Sequence &seq, Recompute mode, const std::vector<View> &outputs,
               const std::vector<View> &kept, SavedPtr &out);

  /// The gradients of the inputs, params and initial states (invalid views:
  /// not wanted) from those of the outputs and final states (invalid:
  /// zeros).
  /// One step of an inference forward (T = 1, nothing kept), as a stream
  /// calls it: inputs `[1, B, n]`, the states to step from `[B, n]` (all
  /// given), outputs `[1, B, n]` and the new states `[B, n]`, which may not
  /// be the states stepped from. No resets, no lengths. The projections'
  /// buffers are made once per B and kept between calls (bytes that the
  /// ledger counts while they live); one step runs at a time.
  /// `packing`, when given, is the backend's record of the weights its
  /// kernels packed into the step's workspace (StepPacking): where it holds
  /// this step's params, they are used again.
  Status step(const Sequence &seq, const std::vector<View> &outputs,
              const std::vector<View> &newStates, StepPacking *packing = nullptr);

  /// For a caller that launches a step's kernel again itself, on the
  /// buffers `step` keeps (a bound step, runtime/cpu/CpuCell.h): the lock
  /// a step holds, and a count that changes whenever those buffers are made
  /// anew (another B, another number of groups).
  std::unique_lock<std::mutex> lockStep();
  int64_t stepEpoch() const;

  Status backward(const Sequence &seq, const Saved &saved,
                  const std::vector<View> &gradOutputs,
                  const std::vector<View> &gradFinalStates,
                  const std::vector<View> &gradInputs,
                  const std::vector<View> &gradParams,
                  const std::vector<View> &gradInitialStates);

  /// The bytes held by the last calls.
  MemoryStats stats() const;

  /// What the forward (or backward) kernel's barriers counted, when it is a
  /// profiling build; not for calls from several threads at once.
  const PhaseProfile &phaseProfile(bool backward) const { return profiles[backward]; }
  void resetPhaseProfile();

  /// About this many rows (steps times the batch) per piece by default:
  /// enough for the projections' and gradients' GEMMs to run near the BLAS's
  /// peak, and a small buffer next to the sequence (bench/cpu/memory.py).
  static constexpr int64_t kPieceRows = 1024;
  void setPieceRows(int64_t rows) { pieceRows = std::max<int64_t>(rows, 1); }

  /// What a training step of `steps` x `batch` in `mode` holds, with the
  /// outputs kept by the caller (as the Python layer does): forward and
  /// backward run on a backend that allocates nothing.
  static Status plan(const Interface &cell, int64_t steps, int64_t batch,
                     Recompute mode, MemoryPlan &out, int64_t pieceRows = kPieceRows,
                     int64_t threads = 1);

  /// Whether a call of `steps` x `batch` rows can count its buffers' sizes,
  /// elements and bytes in int64: an error naming the sizes where not.
  /// Every call checks it first, and so does the plan.
  Status checkExtent(int64_t steps, int64_t batch) const;

  /// Steps per piece for a batch of `batch` rows: the projections and the
  /// gradient GEMMs run over pieces of this many steps (about `pieceRows`
  /// rows, at least one step), so that no buffer but what the mode keeps
  /// spans the sequence.
  int64_t pieceSteps(int64_t batch, int64_t steps) const;

private:
  /// What a kernel of the cell reads over steps [t0, t0 + len), and what the
  /// forward kernel writes.
  struct Chunk {
    int64_t t0 = 0, len = 0;
    View resets;                          // [T, B]
    std::vector<View> projections;        // [len, B, rows], in kernel order
    std::vector<View> initial, start;     // [B, n] a state
    std::vector<View> history;            // [len, B, n] a state
    std::vector<View> end;                // forward: [B, n] a state after the last step
    std::vector<View> outputs;            // forward: [len, B, n] an output
    View gates;                           // [len or 0, B, gates]
    std::vector<View> finalStateGrads;    // backward: [B, n] a state
    std::vector<View> outputGrads;        // backward: [len, B, n] an output
    int64_t rows = -1;                    // the rows that run (-1: all B)
    bool stream = true;                   // ArgKind::Stream: results read later
  };
  /// Where the backward's gradients go, and the buffers it works in
  /// (defined with the backward).
  struct Gradients;
  struct Workspace;
  /// A result the backward kernel wrote.
  struct Written {
    ArgKind kind;
    std::string name;
    View view;
    /// The kernel argument it is, and the earlier one whose values (and
    /// buffer) it repeats (`same_as`), or -1.
    size_t arg;
    int64_t sameAs;
    /// A projection gradient's projection (cell.projections), or -1.
    int64_t projection = -1;
  };
  /// The weight rows in `written` that repeat the projection gradient at
  /// `projectionGrad`, so that one product folds both (Backend::gemmPair).
  size_t pairedWeightRows(const std::vector<Written> &written, size_t projectionGrad,
                          const Interface::Projection &p) const;
  /// The backward over `chunk` (its steps, resets and initial states set):
  /// its states and gates (saved, or replayed), then its pieces, latest
  /// first.
  Status backwardChunk(const Sequence &seq, const Saved &saved, Chunk &chunk,
                       Workspace &w, Gradients &g);
  /// Makes the backward's buffers (`g` says which output gradients are
  /// given).
  Status backwardWorkspace(const Sequence &seq, const Saved &saved,
                           const Gradients &g, Workspace &w);
  /// Runs the backward kernel over `piece` (the variant that replays the
  /// step, or the one that reads saved gates) and folds what it wrote.
  Status backwardPiece(const Sequence &seq, const Chunk &piece, Workspace &w,
                       Gradients &g);
  /// Adds what the backward kernel wrote for steps [first, first + count) to
  /// the gradients, with the GEMMs of the weight, bias and input gradients.
  Status fold(const Sequence &seq, int64_t first, int64_t count,
              const std::vector<Written> &written, Workspace &work, Gradients &g);
  /// Launches `kernel`, counting its own buffers in the ledger while it runs.
  Status launch(const Kernel &kernel, bool backward, bool saveGates,
                const std::vector<Arg> &args, int64_t rows);
  /// A kernel's workspace and barrier words, kept over the launches of one
  /// call: the weights that the last launch packed serve the next one of
  /// the same variant at the same rows.
  struct KernelBuffers {
    std::vector<Scratch> scratch;
    /// The saveGates of the launch whose packed weights `scratch` holds, or
    /// -1.
    int packedFor = -1;
  };
  /// Launches `kernel` on `buffers`' workspace, telling it whether the
  /// weights are packed there already.
  Status launchOn(const Kernel &kernel, bool backward, bool saveGates,
                  std::vector<Arg> &args, int64_t rows, KernelBuffers &buffers);
  /// Adds a profiling kernel's counters to its profile and zeroes them.
  void drainProfile(const Kernel &kernel, bool backward, const std::vector<Arg> &args);
  /// Binds the arguments of `kernel` to `chunk`; the positions of the
  /// backward kernel's results, left unbound, go to `results`.
  Status bind(const Kernel &kernel, const Sequence &seq, const Chunk &chunk,
              bool backward, std::vector<Arg> &args, std::vector<size_t> &results);
  /// Runs the forward kernel over `chunk`.
  Status runForwardChunk(const Sequence &seq, const Chunk &chunk, bool saveGates,
                         KernelBuffers &buffers);
  /// The forward's buffers (defined with the forward).
  struct ForwardRun;
  /// What `step` keeps between calls (defined with it).
  struct StepBuffers;
  std::unique_ptr<StepBuffers> stepBuffers;
  /// The forward's arguments against the cell's interface.
  Status checkForward(const Sequence &seq, const std::vector<View> &outputs,
                      const std::vector<View> &finalStates) const;
  /// Makes the forward's buffers: its defaults, the states' histories and
  /// starts, and the projections of a span (`keep`: what training keeps).
  Status forwardBuffers(const Sequence &seq, const std::vector<View> &outputs,
                        Recompute mode, bool training, Saved *keep, ForwardRun &run);
  /// Runs steps [t0, t0 + len) (a span): the states before a chunk kept,
  /// the span's projections, the forward kernel, the final states of the
  /// samples that end in it; the next span's start.
  Status forwardSpan(const Sequence &seq, int64_t t0, int64_t len,
                     const std::vector<View> &outputs, const std::vector<View> &finalStates,
                     ForwardRun &run);
  /// The kernel's workspace and barrier words for `batch` rows, in `keep`
  /// (used again where it holds them at the sizes needed: `*reused`).
  Status workspace(const Kernel &kernel, bool backward, bool saveGates, int64_t batch,
                   std::vector<Arg> &args,
                   std::vector<Scratch> &keep, bool *reused = nullptr);
  /// A buffer of the driver's, counted in its ledger.
  Status scratch(std::vector<int64_t> shape, Element element, bool zero,
                 Scratch &out);
  /// Projection `p` of steps [t0, t0 + len) into `out` ([len, B, rows]).
  Status project(const Sequence &seq, const Interface::Projection &p, int64_t t0,
                 int64_t len, const View &out);
  /// The last steps of the pieces that the backward runs chunk [t0, t0 +
  /// len) in, latest first: the chunk's last step, every sample's last step
  /// inside it, and enough more that no piece is longer than `steps`.
  static std::vector<int64_t> pieceEnds(const std::vector<int64_t> &lengths,
                                        int64_t t0, int64_t len, int64_t steps);
  /// The output that a training forward keeps as `state`'s history, or -1.
  int64_t keptOutput(size_t state, Recompute mode, bool hasLengths,
                     bool outputsOutliveSaved) const;
  /// What a training forward keeps, as keptLayout says: in the caller's
  /// `kept` buffers, or the driver's.
  Status makeSaved(const Sequence &seq, Recompute mode, const std::vector<View> &outputs,
                   bool outputsOutliveSaved, const std::vector<View> *kept,
                   SavedPtr &out);
  /// The gradients of the outputs over steps [first, first + count): the
  /// caller's, or a copy in the workspace with zeros where none are given
  /// and past each sample's length.
  Status outputGradsOf(const Sequence &seq, const std::vector<View> &gradOutputs,
                       int64_t first, int64_t count, Workspace &w,
                       std::vector<View> &out);
  /// Whether ended samples stop running: lengths sorted longest first (and
  /// not all equal), so that the running samples are the first rows.
  static bool skipsEndedRows(const std::vector<int64_t> &lengths);
  /// The rows that run in a piece that ends at `step`.
  static int64_t rowsRunning(const std::vector<int64_t> &lengths, int64_t B,
                             int64_t step);
  /// Steps [begin, begin + len) of `chunk`.
  static Chunk slice(const Chunk &chunk, int64_t B, int64_t begin, int64_t len);
  /// A piece's start states in the compute type: those of another type
  /// (from a history in the storage type) converted into `keep`.
  Status startsInCompute(Chunk &piece, std::vector<Scratch> &keep);
  /// Makes `piece` start from `ends` (the last piece's end states), copied
  /// into `keep`.
  Status endsAsStarts(const std::vector<View> &ends, Chunk &piece,
                      std::vector<Scratch> &keep);
  /// What a forward or backward call makes first, for its launches to read:
  /// its lengths on the backend (`lengthsOnBackend`) and the params its
  /// kernels take transposed (`transposed`).
  struct CallBuffers;
  Status beginCall(const Sequence &seq, CallBuffers &keep);
  /// The call's lengths in a buffer of the backend's (`lengthsOnBackend`),
  /// uploaded once a call; nothing without lengths.
  Status uploadLengths(const std::vector<int64_t> &lengths, Scratch &keep);
  /// Adds the final-state gradient of each sample whose last step is `step`
  /// to the gradient carried into that step: one pass a state, where a
  /// sample ends there.
  Status injectFinalStateGrads(const std::vector<int64_t> &lengths, int64_t step,
                               const std::vector<View> &gradFinalStates,
                               std::vector<Scratch> &carry);
  /// Writes zeros over the rows [t, b] of `views` ([len, B, n] each, from
  /// step `first` on) with t >= lengths[b]: one pass a view.
  Status zeroPastLengths(const std::vector<int64_t> &lengths, int64_t first,
                         const std::vector<View> &views);
  /// The final state of each sample whose last step is in [t0, t0 + len):
  /// from `history` ([len, B, n] a state) into `finalStates`, one pass a
  /// state, where a sample ends there.
  Status gatherFinalStates(const std::vector<int64_t> &lengths, int64_t t0,
                           int64_t len, const std::vector<View> &history,
                           const std::vector<View> &finalStates);
  /// The current call's lengths on the backend ([B] int32), while it runs.
  View lengthsOnBackend;
  /// The transposed copies of the params that the kernels take so
  /// (ArgKind::ParamTransposed), made into `keep` once a call; `transposed`
  /// holds them by param, while the call runs.
  Status transposeParams(const Sequence &seq, std::vector<Scratch> &keep);
  std::vector<View> transposed;
  /// The resets and initial states of `seq`, zeros (kept in `defaults`)
  /// where the caller left them out: resets for the `longest` launch.
  Status resetsAndInitial(const Sequence &seq, int64_t longest,
                          std::vector<Scratch> &defaults, View &resets,
                          std::vector<View> &initial);

  Interface cell;
  std::shared_ptr<Backend> backend;
  std::shared_ptr<Ledger> ledger;
  MemoryStats last;
  int64_t pieceRows = kPieceRows;
  PhaseProfile profiles[2];
};

} // namespace cellc::driver

#endif // CELLC_RUNTIME_DRIVER_SEQUENCEDRIVER_H
