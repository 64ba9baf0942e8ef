//===- CpuCell.cpp - Run a cell on the CPU: forward, backward, modes ------===//

#include "runtime/CpuCell.h"
#include "runtime/Tuning.h"
#include "runtime/KernelCache.h"

#include "compiler/Conversion/Passes.h"
#include "compiler/Conversion/Common/KernelABI.h"
#include "compiler/Frontend/IRGen.h"
#include "compiler/Pipelines/Pipelines.h"
#include "dialects/Cell/IR/CellOps.h"

#include "mlir/IR/Diagnostics.h"
#include "mlir/IR/MLIRContext.h"
#include "mlir/Pass/PassManager.h"
#include "llvm/ADT/STLExtras.h"
#include "llvm/Support/FormatVariadic.h"
#include "llvm/Support/MemoryBuffer.h"
#include "llvm/Support/SourceMgr.h"
#include "llvm/Config/llvm-config.h"
#include "llvm/TargetParser/Host.h"

#include <cblas.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <mutex>
#include <thread>

using namespace cellc;
using namespace cellc::runtime;

//===----------------------------------------------------------------------===//
// Recompute
//===----------------------------------------------------------------------===//

llvm::Expected<Recompute> Recompute::parse(llvm::StringRef text) {
  Recompute mode;
  if (text == "none")
    return mode;
  if (text == "full") {
    mode.kind = Kind::Full;
    return mode;
  }
  int64_t k;
  llvm::StringRef rest = text;
  if (rest.consume_front("chunk:") && !rest.getAsInteger(10, k) && k > 0) {
    mode.kind = Kind::Chunk;
    mode.chunk = k;
    return mode;
  }
  return llvm::createStringError(
      llvm::inconvertibleErrorCode(),
      "unknown recompute mode '%s'; expected none, full or chunk:K with K > 0",
      text.str().c_str());
}

std::string Recompute::str() const {
  switch (kind) {
  case Kind::None:
    return "none";
  case Kind::Full:
    return "full";
  case Kind::Chunk:
    return "chunk:" + std::to_string(chunk);
  }
  return "";
}

//===----------------------------------------------------------------------===//
// Buffers and BLAS
//===----------------------------------------------------------------------===//

namespace {

llvm::Error fail(const llvm::Twine &message) {
  return llvm::createStringError(llvm::inconvertibleErrorCode(), message);
}

std::string shapeStr(llvm::ArrayRef<int64_t> shape) {
  std::string s = "[";
  for (auto [i, d] : llvm::enumerate(shape))
    s += (i ? ", " : "") + std::to_string(d);
  return s + "]";
}

int64_t product(llvm::ArrayRef<int64_t> shape) {
  int64_t n = 1;
  for (int64_t d : shape)
    n *= d;
  return n;
}

/// Memory that scratch buffers return for the next call to reuse. The same
/// sizes come back every call, and fresh large allocations are fresh pages:
/// their page faults were about a tenth of a training step (LSTM, B = 64,
/// H = 256). At most `kKeptBytes` are kept; the rest goes back to the system.
class BufferPool {
public:
  static BufferPool &get() {
    // Never destroyed: buffers may come back while the process exits.
    static BufferPool *pool = new BufferPool();
    return *pool;
  }

  /// A buffer of at least `words` doubles; `zero` clears it.
  std::unique_ptr<double[]> take(int64_t words, bool zero) {
    std::unique_ptr<double[]> buffer;
    {
      std::lock_guard<std::mutex> lock(mutex);
      // The smallest kept buffer that fits, if it is not twice too large.
      auto it = free.lower_bound(words);
      if (it != free.end() && it->first <= 2 * words) {
        buffer = std::move(it->second);
        keptBytes -= it->first * 8;
        free.erase(it);
      }
    }
    if (!buffer)
      return std::unique_ptr<double[]>(zero ? new double[words]() : new double[words]);
    if (zero)
      std::memset(buffer.get(), 0, words * 8);
    return buffer;
  }

  /// Takes back a buffer of `words` doubles.
  void give(std::unique_ptr<double[]> buffer, int64_t words) {
    std::lock_guard<std::mutex> lock(mutex);
    if (keptBytes + words * 8 > kKeptBytes)
      return;
    keptBytes += words * 8;
    free.emplace(words, std::move(buffer));
  }

private:
  static constexpr int64_t kKeptBytes = int64_t(1) << 30;
  std::mutex mutex;
  std::multimap<int64_t, std::unique_ptr<double[]>> free;
  int64_t keptBytes = 0;
};

/// An owned buffer aligned for doubles: zeroed for accumulators, left as it
/// is for what a GEMM or a kernel writes in full. Its memory comes from, and
/// goes back to, the buffer pool.
struct Scratch {
  std::unique_ptr<double[]> storage;
  int64_t words = 0;
  std::vector<int64_t> shape;
  Scratch() = default;
  Scratch(std::vector<int64_t> shape, int64_t elementBytes, bool zero = true)
      : words((product(shape) * elementBytes + 7) / 8 + 1), shape(shape) {
    storage = BufferPool::get().take(words, zero);
  }
  Scratch(Scratch &&) = default;
  Scratch &operator=(Scratch &&other) {
    release();
    storage = std::move(other.storage);
    words = other.words;
    shape = std::move(other.shape);
    return *this;
  }
  ~Scratch() { release(); }
  void *data() { return storage.get(); }
  int64_t bytes() const { return words * 8; }

private:
  void release() {
    if (storage)
      BufferPool::get().give(std::move(storage), words);
  }
};

/// Row-major C = alpha op(A) op(B) + beta C.
void gemm(DType dtype, bool transA, bool transB, int64_t m, int64_t n,
          int64_t k, const void *a, int64_t lda, const void *b, int64_t ldb,
          double beta, void *c, int64_t ldc) {
  if (m == 0 || n == 0 || k == 0)
    return;
  auto ta = transA ? CblasTrans : CblasNoTrans;
  auto tb = transB ? CblasTrans : CblasNoTrans;
  if (dtype == DType::F32)
    cblas_sgemm(CblasRowMajor, ta, tb, m, n, k, 1.0f,
                static_cast<const float *>(a), lda,
                static_cast<const float *>(b), ldb, static_cast<float>(beta),
                static_cast<float *>(c), ldc);
  else
    cblas_dgemm(CblasRowMajor, ta, tb, m, n, k, 1.0,
                static_cast<const double *>(a), lda,
                static_cast<const double *>(b), ldb, beta,
                static_cast<double *>(c), ldc);
}

/// acc[j] += sum over rows of m[row, j] (or += v[j] with rows = 1).
void addColumnSums(DType dtype, const void *m, int64_t rows, int64_t cols,
                   void *acc) {
  if (dtype == DType::F32) {
    auto *a = static_cast<float *>(acc);
    auto *x = static_cast<const float *>(m);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t j = 0; j < cols; ++j)
        a[j] += x[r * cols + j];
  } else {
    auto *a = static_cast<double *>(acc);
    auto *x = static_cast<const double *>(m);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t j = 0; j < cols; ++j)
        a[j] += x[r * cols + j];
  }
}

/// m[row, :] = the sum of `vectors` for every row.
void fillRows(DType dtype, void *m, int64_t rows, int64_t cols,
              llvm::ArrayRef<const void *> vectors) {
  auto fill = [&](auto *x) {
    using E = std::remove_pointer_t<decltype(x)>;
    std::vector<E> sum(cols, E(0));
    for (const void *v : vectors)
      for (int64_t j = 0; j < cols; ++j)
        sum[j] += static_cast<const E *>(v)[j];
    for (int64_t r = 0; r < rows; ++r)
      std::memcpy(x + r * cols, sum.data(), cols * sizeof(E));
  };
  if (dtype == DType::F32)
    fill(static_cast<float *>(m));
  else
    fill(static_cast<double *>(m));
}

/// One kernel argument as the runtime sees it.
struct ArgInfo {
  ArgKind kind;
  std::string name, input;
  std::vector<std::string> biases;
  /// The memref shape; -1 for the time and batch dimensions.
  std::vector<int64_t> shape;
  /// A result that repeats the result at argument `sameAs` (-1: none), or
  /// that is zero.
  int64_t sameAs = -1;
  bool zero = false;
};

using Signature = std::vector<ArgInfo>;

Signature signatureOf(mlir::func::FuncOp func) {
  Signature sig;
  for (auto [attr, type] :
       llvm::zip(mlir::cell::kernelArgsOf(func), func.getArgumentTypes())) {
    ArgInfo arg;
    arg.kind = attr.getKind();
    arg.name = attr.getName().str();
    arg.input = attr.getInput().str();
    for (mlir::StringAttr b : attr.getBiases())
      arg.biases.push_back(b.str());
    arg.sameAs = attr.getSameAs();
    arg.zero = attr.getZero();
    if (auto memref = llvm::dyn_cast<mlir::MemRefType>(type))
      for (int64_t d : memref.getShape())
        arg.shape.push_back(mlir::ShapedType::isDynamic(d) ? -1 : d);
    sig.push_back(std::move(arg));
  }
  return sig;
}

/// A projection the runtime computes with BLAS: weight @ input + biases.
struct Projection {
  size_t weight, input;
  std::vector<size_t> biases;
  int64_t rows, cols;
};

} // namespace

bool CpuCell::usesBatchedKernels(const Options &options) {
  using Kernels = Options::Kernels;
  switch (options.kernels) {
  case Kernels::Batched:
    return true;
  case Kernels::PerRow:
    return false;
  case Kernels::Auto:
    return options.batchHint != 1;
  }
  llvm_unreachable("every kind of kernels is handled above");
}

int64_t CpuCell::hostVectorRegisters() {
  llvm::StringMap<bool> features = llvm::sys::getHostCPUFeatures();
  return features.lookup("avx512f") ? 32 : 16;
}

CpuCell::BatchedShape CpuCell::batchedShape(const Options &options) {
  // The largest block whose accumulators, panel vectors and broadcast fit
  // the vector registers: 8 rows by 3 vectors in AVX-512's 32, 6 by 2 in
  // AVX2's 16.
  bool wide = hostVectorRegisters() >= 32;
  BatchedShape shape;
  // 64 rows, or fewer for a batch known to be smaller: a tile's buffers
  // need not be larger than the rows.
  shape.tile = 64;
  if (options.batchHint > 0 && options.batchHint < 64)
    shape.tile = (options.batchHint + 7) / 8 * 8;
  if (options.batchTile > 0)
    shape.tile = options.batchTile;
  shape.rows = options.productRows > 0 ? options.productRows : wide ? 8 : 6;
  shape.vectors = options.productVectors > 0 ? options.productVectors : wide ? 3 : 2;
  return shape;
}

//===----------------------------------------------------------------------===//
// Saved
//===----------------------------------------------------------------------===//

struct cellc::runtime::Saved {
  Recompute mode;
  int64_t steps = 0, batch = 0;
  /// Steps per chunk: T unless the mode is chunk:K with K < T.
  int64_t chunkSteps = 0;
  /// none, full: each state after each step, [T, B, n]. chunk: the state
  /// before each chunk, [chunks, B, n].
  std::vector<Scratch> states;
  /// none: the planned gate values, [T, B, S].
  Scratch gates;
};

void SavedDeleter::operator()(Saved *saved) const { delete saved; }

int64_t CpuCell::savedBytes(const Saved &saved) {
  int64_t bytes = saved.gates.storage ? saved.gates.bytes() : 0;
  for (const Scratch &s : saved.states)
    bytes += s.bytes();
  return bytes;
}

//===----------------------------------------------------------------------===//
// CpuCell
//===----------------------------------------------------------------------===//

struct CpuCell::Impl {
  std::string name;
  std::unique_ptr<JitKernels> saving, replaying;
  Signature fwd, bwd;
  std::vector<Projection> projections;
  int64_t gatesWidth = 0;
};

CpuCell::CpuCell(std::unique_ptr<Impl> impl) : impl(std::move(impl)) {}
CpuCell::~CpuCell() = default;

void CpuCell::setThreads(int threads) {
  numThreads = threads > 0 ? threads
                           : std::max(1u, std::thread::hardware_concurrency());
}

llvm::Expected<std::unique_ptr<CpuCell>>
CpuCell::compile(llvm::StringRef source, llvm::StringRef fileName,
                 const SizeBindings &sizes, DType dtype, Options options) {
  mlir::MLIRContext context;
  CellSource src(source, fileName);
  llvm::raw_string_ostream &os = src.os;
  mlir::FloatType element = dtype == DType::F32
                                ? mlir::FloatType(mlir::Float32Type::get(&context))
                                : mlir::FloatType(mlir::Float64Type::get(&context));
  auto module = compileCellSource(context, sizes, element, src.diag);
  if (!module)
    return fail(src.diagnostics());
  mlir::SourceMgrDiagnosticHandler handler(src.sourceMgr, &context, os);

  auto impl = std::make_unique<Impl>();
  std::unique_ptr<CpuCell> cell(new CpuCell(nullptr));
  cell->elementType = dtype;
  // A tuned config for this cell, machine and batch bucket replaces the
  // knobs given.
  if (options.useTuned && options.batchHint > 0) {
    std::string key = tuningKey(source, sizes, dtype, options.batchHint,
                                TuneTarget::Cpu, deviceName(TuneTarget::Cpu));
    if (auto tuned = lookupTuned(key, TuneTarget::Cpu, options.cacheDir)) {
      applyConfig(*tuned, options);
      cell->configOrigin = "tuned";
    }
  }
  cell->setThreads(options.threads);
  cell->configText = str(configOf(options, cell->numThreads));
  if (const char *log = std::getenv("CELLC_LOG"); log && llvm::StringRef(log).contains("tune"))
    llvm::errs() << "cellc: " << fileName << ": " << cell->configOrigin
                 << " config " << cell->configText << "\n";
  auto def = *module->getOps<mlir::cell::DefOp>().begin();
  impl->name = def.getSymName().str();
  auto vectorSize = [](mlir::Value v) {
    return llvm::cast<mlir::RankedTensorType>(v.getType()).getDimSize(0);
  };
  for (auto [n, arg] : llvm::zip(def.getInputNames(), def.getInputs()))
    cell->inputSlots.push_back({llvm::cast<mlir::StringAttr>(n).str(), {vectorSize(arg)}});
  for (auto [n, arg] : llvm::zip(def.getStateNames(), def.getStates()))
    cell->stateSlots.push_back({llvm::cast<mlir::StringAttr>(n).str(), {vectorSize(arg)}});
  for (auto param : def.getBody().getOps<mlir::cell::ParamOp>()) {
    auto type = llvm::cast<mlir::RankedTensorType>(param.getType());
    cell->paramSlots.push_back(
        {param.getName().str(),
         std::vector<int64_t>(type.getShape().begin(), type.getShape().end())});
  }
  for (auto [n, out] : llvm::zip(def.getOutputNames(), def.getYield().getOutputs()))
    cell->outputSlots.push_back({llvm::cast<mlir::StringAttr>(n).str(), {vectorSize(out)}});

  // The cache key covers the kernels as lowered to the LLVM dialect (so any
  // change in the cell, its sizes, dtype or variant, or in this compiler's
  // lowering changes it), LLVM's version (which generates the code) and the
  // host CPU (which it generates the code for).
  std::string host = deviceName(TuneTarget::Cpu);
  KernelCache cache(options.cacheDir);
  cell->fromCache = options.useCache;

  for (bool saveGates : {true, false}) {
    std::unique_ptr<JitKernels> &slot = saveGates ? impl->saving : impl->replaying;
    mlir::OwningOpRef<mlir::ModuleOp> copy = module->clone();
    mlir::PassManager pm(&context);
    PipelineOptions pipeline;
    pipeline.saveGates = saveGates;
    if (options.batchTiled) {
      pipeline.strategy = options.persistent ? KernelStrategy::Persistent
                                             : KernelStrategy::BatchTiled;
      pipeline.batchTile = options.batchTile;
      pipeline.ctas = options.ctas;
    } else if (usesBatchedKernels(options)) {
      BatchedShape shape = batchedShape(options);
      pipeline.strategy = KernelStrategy::Batched;
      pipeline.batchTile = shape.tile;
      pipeline.productRows = shape.rows;
      pipeline.productVectors = shape.vectors;
      pipeline.vectorWidth = options.vectorWidth;
    } else {
      pipeline.strategy = KernelStrategy::PerRow;
    }
    pipeline.matvecWidth = options.matvecWidth;
    pipeline.matvecUnroll = options.matvecUnroll;
    buildPipeline(pm, Stage::Kernels, pipeline);
    if (mlir::failed(pm.run(*copy)))
      return fail("cellc: building the kernels failed:\n" + os.str());
    if (saveGates) {
      impl->fwd = signatureOf(copy->lookupSymbol<mlir::func::FuncOp>(impl->name + "_fwd"));
      impl->bwd = signatureOf(copy->lookupSymbol<mlir::func::FuncOp>(impl->name + "_bwd"));
    }
    mlir::PassManager lower(&context);
    lower.addPass(mlir::cell::createConvertKernelsToLLVM());
    if (mlir::failed(lower.run(*copy)))
      return fail("cellc: lowering the kernels to LLVM failed:\n" + os.str());
    std::string lowered;
    {
      llvm::raw_string_ostream ir(lowered);
      copy->print(ir);
    }
    std::string key = KernelCache::key(
        {compilerVersion(), LLVM_VERSION_STRING, lowered, host, "O3"});

    // A sound cached object skips the code generation; a missing or corrupt
    // one is compiled again and replaced.
    if (options.useCache) {
      if (auto object = cache.load(key)) {
        auto jit = JitKernels::load(std::move(object));
        if (jit) {
          slot = std::move(*jit);
          continue;
        }
        llvm::consumeError(jit.takeError());
      }
    }
    cell->fromCache = false;
    std::string object;
    auto jit = JitKernels::compile(*copy, options.useCache ? &object : nullptr);
    if (!jit)
      return jit.takeError();
    slot = std::move(*jit);
    // A cache that cannot be written only costs the next run a compile.
    if (options.useCache)
      llvm::consumeError(cache.store(key, object));
  }

  auto indexOf = [](const std::vector<Slot> &slots, llvm::StringRef name) {
    for (auto [i, s] : llvm::enumerate(slots))
      if (s.name == name)
        return i;
    return size_t(-1);
  };
  for (const ArgInfo &arg : impl->fwd) {
    if (arg.kind == ArgKind::Gates)
      impl->gatesWidth = arg.shape.back();
    if (arg.kind != ArgKind::Projection)
      continue;
    Projection p;
    p.weight = indexOf(cell->paramSlots, arg.name);
    p.input = indexOf(cell->inputSlots, arg.input);
    for (const std::string &b : arg.biases)
      p.biases.push_back(indexOf(cell->paramSlots, b));
    p.rows = cell->paramSlots[p.weight].shape[0];
    p.cols = cell->paramSlots[p.weight].shape[1];
    impl->projections.push_back(p);
  }
  cell->impl = std::move(impl);
  return cell;
}

namespace {

/// A pointer `offset` elements into `data`.
void *at(void *data, int64_t offset, int64_t elementBytes) {
  return static_cast<char *>(data) + offset * elementBytes;
}

/// The projection `p` (weight @ input + biases) of the steps [t0, t0 + len):
/// the rows start as the biases' sum, and the GEMM adds to them, so no pass
/// over the result adds the biases afterwards.
Scratch project(const Projection &p, const CpuCell::Sequence &seq, int64_t t0,
                int64_t len, int64_t B, DType dtype) {
  int64_t eb = dtype == DType::F32 ? 4 : 8;
  Scratch out(std::vector<int64_t>{len, B, p.rows}, eb, /*zero=*/false);
  std::vector<const void *> biases;
  for (size_t b : p.biases)
    biases.push_back(seq.params[b].data);
  if (!biases.empty())
    fillRows(dtype, out.data(), len * B, p.rows, biases);
  gemm(dtype, false, true, len * B, p.rows, p.cols,
       at(seq.inputs[p.input].data, t0 * B * p.cols, eb), p.cols,
       seq.params[p.weight].data, p.cols, biases.empty() ? 0.0 : 1.0, out.data(),
       p.rows);
  return out;
}

/// Checks one caller buffer: present, aligned, and of the expected shape.
llvm::Error checkArray(const Array &array, llvm::ArrayRef<int64_t> shape,
                       int64_t elementBytes, const std::string &what,
                       bool optional = false) {
  if (!array.data) {
    if (optional)
      return llvm::Error::success();
    return fail(what + " is a null pointer");
  }
  if (reinterpret_cast<uintptr_t>(array.data) % elementBytes != 0)
    return fail(what + " is not aligned to its " +
                llvm::Twine(elementBytes) + "-byte elements");
  if (array.shape != std::vector<int64_t>(shape.begin(), shape.end()))
    return fail(what + " has shape " + shapeStr(array.shape) + ", expected " +
                shapeStr(shape));
  return llvm::Error::success();
}

/// Runs `fn(bBegin, bEnd)` over batch tiles on up to `threads` threads.
llvm::Error parallelBatches(int64_t batch, int threads,
                            const std::function<llvm::Error(int64_t, int64_t)> &fn) {
  int64_t tiles = std::max<int64_t>(1, std::min<int64_t>(threads, batch));
  if (tiles == 1)
    return fn(0, batch);
  std::vector<std::thread> workers;
  std::vector<std::string> errors(tiles);
  for (int64_t i = 0; i < tiles; ++i) {
    int64_t begin = batch * i / tiles, end = batch * (i + 1) / tiles;
    workers.emplace_back([&, i, begin, end] {
      if (llvm::Error e = fn(begin, end))
        errors[i] = llvm::toString(std::move(e));
    });
  }
  for (std::thread &w : workers)
    w.join();
  for (const std::string &e : errors)
    if (!e.empty())
      return fail(e);
  return llvm::Error::success();
}


} // namespace

/// Zeros for what the caller left out: no resets, no initial states.
struct Defaults {
  Defaults(const CpuCell::Sequence &seq, const std::vector<Slot> &states,
           int64_t T, int64_t B, int64_t eb) {
    resets = seq.resets;
    if (!resets) {
      noResets.assign(T * B, 0);
      resets = noResets.data();
    }
    for (auto [i, slot] : llvm::enumerate(states)) {
      if (!seq.initialStates.empty() && seq.initialStates[i].data) {
        initial.push_back(seq.initialStates[i].data);
      } else {
        zeros.emplace_back(std::vector<int64_t>{B, slot.shape[0]}, eb);
        initial.push_back(zeros.back().data());
      }
    }
  }
  std::vector<uint8_t> noResets;
  std::vector<Scratch> zeros;
  const uint8_t *resets;
  std::vector<void *> initial;
};

/// Buffers of one kernel call, looked up by argument kind and name.
namespace {
struct CallBuffers {
  std::map<std::pair<ArgKind, std::string>, std::pair<void *, std::vector<int64_t>>> byName;
  std::vector<std::pair<void *, std::vector<int64_t>>> projections, projectionGrads;

  void set(ArgKind kind, const std::string &name, void *data,
           std::vector<int64_t> shape) {
    byName[{kind, name}] = {data, std::move(shape)};
  }

  /// The kernel's arguments in its order, for the batch rows [b0, b1).
  llvm::Expected<std::vector<KernelArg>> args(const Signature &sig) const {
    std::vector<KernelArg> result;
    size_t projection = 0, projectionGrad = 0;
    for (const ArgInfo &arg : sig) {
      if (arg.kind == ArgKind::BatchBegin || arg.kind == ArgKind::BatchEnd) {
        result.push_back(KernelArg::indexValue(0));
        continue;
      }
      const std::pair<void *, std::vector<int64_t>> *buffer = nullptr;
      if (arg.kind == ArgKind::Projection)
        buffer = &projections.at(projection++);
      else if (arg.kind == ArgKind::ProjectionGrad)
        buffer = &projectionGrads.at(projectionGrad++);
      else {
        auto it = byName.find({arg.kind, arg.name});
        if (it == byName.end())
          return fail(llvm::Twine("internal error: no buffer for kernel argument ") +
                      name(arg.kind) + " '" + arg.name + "'");
        buffer = &it->second;
      }
      result.push_back(KernelArg::buffer(buffer->first, buffer->second));
    }
    return result;
  }
};
} // namespace

namespace {
/// Copies `src` laid out [A, C, n] into `dst` laid out [C, A, n].
void swapLeadingDims(const void *src, void *dst, int64_t a, int64_t c,
                     int64_t rowBytes) {
  for (int64_t i = 0; i < a; ++i)
    for (int64_t j = 0; j < c; ++j)
      std::memcpy(static_cast<char *>(dst) + (j * a + i) * rowBytes,
                  static_cast<const char *>(src) + (i * c + j) * rowBytes,
                  rowBytes);
}

/// Batch-first buffers turned time-major: owns the copies.
struct TimeMajor {
  std::vector<std::vector<double>> storage;
  std::vector<uint8_t> resets;

  /// A time-major copy of `array` ([B, T, n] → [T, B, n]), or an empty
  /// buffer of that shape when `copy` is false.
  Array from(const Array &array, int64_t eb, bool copy) {
    int64_t b = array.shape[0], t = array.shape[1], n = array.shape[2];
    storage.emplace_back((b * t * n * eb + 7) / 8 + 1);
    if (copy && array.data)
      swapLeadingDims(array.data, storage.back().data(), b, t, n * eb);
    return {array.data ? storage.back().data() : nullptr, {t, b, n}};
  }
};

/// The time-major view of a batch-first sequence, after checking its inputs:
/// copies of the inputs and resets live in `tm`. Sets T and B.
llvm::Expected<cellc::runtime::CpuCell::Sequence>
timeMajorSequence(const cellc::runtime::CpuCell::Sequence &seq, TimeMajor &tm,
                  int64_t eb, int64_t &T, int64_t &B);

/// Checks that every array is rank 3 and batch-first over [B, T].
llvm::Error checkBatchFirst(const std::vector<Array> &arrays, int64_t B,
                            int64_t T, const char *what) {
  for (const Array &a : arrays)
    if (a.data && (a.shape.size() != 3 || a.shape[0] != B || a.shape[1] != T))
      return fail(llvm::Twine("batch-first ") + what + " has shape " +
                  shapeStr(a.shape) + ", expected [" + llvm::Twine(B) + ", " +
                  llvm::Twine(T) + ", n]");
  return llvm::Error::success();
}

llvm::Expected<cellc::runtime::CpuCell::Sequence>
timeMajorSequence(const cellc::runtime::CpuCell::Sequence &seq, TimeMajor &tm,
                  int64_t eb, int64_t &T, int64_t &B) {
  if (seq.inputs.empty() || seq.inputs[0].shape.size() != 3)
    return fail("batch-first sequences need inputs of shape [B, T, n]");
  B = seq.inputs[0].shape[0];
  T = seq.inputs[0].shape[1];
  if (auto e = checkBatchFirst(seq.inputs, B, T, "input"))
    return std::move(e);
  cellc::runtime::CpuCell::Sequence inner = seq;
  inner.batchFirst = false;
  for (Array &a : inner.inputs)
    a = tm.from(a, eb, true);
  if (seq.resets) {
    tm.resets.resize(T * B);
    swapLeadingDims(seq.resets, tm.resets.data(), B, T, 1);
    inner.resets = tm.resets.data();
  }
  return inner;
}
} // namespace

llvm::Error CpuCell::forward(const Sequence &seq,
                             const std::vector<Array> &outputs,
                             const std::vector<Array> &finalStates,
                             Recompute mode, SavedPtr *saved) {
  if (!seq.batchFirst)
    return forwardTimeMajor(seq, outputs, finalStates, mode, saved);
  int64_t eb = elementBytes(), T, B;
  TimeMajor tm;
  auto inner = timeMajorSequence(seq, tm, eb, T, B);
  if (!inner)
    return inner.takeError();
  if (auto e = checkBatchFirst(outputs, B, T, "output"))
    return e;
  std::vector<Array> innerOutputs;
  for (const Array &a : outputs)
    innerOutputs.push_back(tm.from(a, eb, false));
  if (auto e = forwardTimeMajor(*inner, innerOutputs, finalStates, mode, saved))
    return e;
  for (auto [i, a] : llvm::enumerate(outputs))
    swapLeadingDims(innerOutputs[i].data, a.data, T, B, a.shape[2] * eb);
  return llvm::Error::success();
}

llvm::Error CpuCell::backward(const Sequence &seq, const Saved &saved,
                              const std::vector<Array> &gradOutputs,
                              const std::vector<Array> &gradFinalStates,
                              const std::vector<Array> &gradInputs,
                              const std::vector<Array> &gradParams,
                              const std::vector<Array> &gradInitialStates) {
  if (!seq.batchFirst)
    return backwardTimeMajor(seq, saved, gradOutputs, gradFinalStates,
                             gradInputs, gradParams, gradInitialStates);
  int64_t eb = elementBytes(), T, B;
  TimeMajor tm;
  auto inner = timeMajorSequence(seq, tm, eb, T, B);
  if (!inner)
    return inner.takeError();
  if (auto e = checkBatchFirst(gradOutputs, B, T, "output gradient"))
    return e;
  if (auto e = checkBatchFirst(gradInputs, B, T, "input gradient"))
    return e;
  std::vector<Array> innerGradOutputs, innerGradInputs;
  for (const Array &a : gradOutputs)
    innerGradOutputs.push_back(a.data ? tm.from(a, eb, true) : a);
  for (const Array &a : gradInputs)
    innerGradInputs.push_back(a.data ? tm.from(a, eb, false) : a);
  if (auto e = backwardTimeMajor(*inner, saved, innerGradOutputs, gradFinalStates,
                                 innerGradInputs, gradParams, gradInitialStates))
    return e;
  for (auto [i, a] : llvm::enumerate(gradInputs))
    if (a.data)
      swapLeadingDims(innerGradInputs[i].data, a.data, T, B, a.shape[2] * eb);
  return llvm::Error::success();
}

llvm::Error CpuCell::runKernel(JitKernels &kernels, llvm::StringRef suffix,
                               std::vector<KernelArg> args, int64_t batch) {
  std::string name = impl->name + suffix.str();
  return parallelBatches(batch, numThreads, [&](int64_t b0, int64_t b1) {
    std::vector<KernelArg> mine = args;
    mine[mine.size() - 2] = KernelArg::indexValue(b0);
    mine[mine.size() - 1] = KernelArg::indexValue(b1);
    return kernels.call(name, mine);
  });
}

llvm::Error CpuCell::runForwardChunk(
    JitKernels &kernels, const Sequence &seq, int64_t t0, int64_t len,
    int64_t B, const uint8_t *resets, const std::vector<void *> &projections,
    const std::vector<void *> &initial, const std::vector<void *> &start,
    const std::vector<void *> &history, const std::vector<void *> &outputs,
    void *gates) {
  Impl &im = *impl;
  int64_t eb = elementBytes();
  CallBuffers call;
  for (auto [i, slot] : llvm::enumerate(inputSlots))
    call.set(ArgKind::Input, slot.name, at(seq.inputs[i].data, t0 * B * slot.shape[0], eb),
             {len, B, slot.shape[0]});
  for (auto [p, proj] : llvm::enumerate(im.projections))
    call.projections.push_back({projections[p], {len, B, proj.rows}});
  call.set(ArgKind::Resets, "resets", const_cast<uint8_t *>(resets + t0 * B), {len, B});
  for (auto [i, slot] : llvm::enumerate(stateSlots)) {
    call.set(ArgKind::InitialState, slot.name, initial[i], {B, slot.shape[0]});
    call.set(ArgKind::StartState, slot.name, start[i], {B, slot.shape[0]});
    call.set(ArgKind::StateHistory, slot.name, history[i], {len, B, slot.shape[0]});
  }
  for (auto [i, slot] : llvm::enumerate(paramSlots))
    call.set(ArgKind::Param, slot.name, seq.params[i].data, slot.shape);
  for (auto [i, slot] : llvm::enumerate(outputSlots))
    call.set(ArgKind::Output, slot.name, outputs[i], {len, B, slot.shape[0]});
  call.set(ArgKind::Gates, "gates", gates, {len, B, im.gatesWidth});
  auto args = call.args(im.fwd);
  if (!args)
    return args.takeError();
  return runKernel(kernels, "_fwd", std::move(*args), B);
}

llvm::Error CpuCell::forwardTimeMajor(const Sequence &seq,
                                      const std::vector<Array> &outputs,
                                      const std::vector<Array> &finalStates,
                                      Recompute mode, SavedPtr *saved) {
  Impl &im = *impl;
  int64_t eb = elementBytes();
  // T and B come from the first input, or are given.
  int64_t T = seq.steps, B = seq.batch;
  if (!seq.inputs.empty() && seq.inputs[0].shape.size() == 3) {
    T = seq.inputs[0].shape[0];
    B = seq.inputs[0].shape[1];
  }
  if (T < 1 || B < 1)
    return fail("the sequence needs T >= 1 steps and B >= 1 rows; got T=" +
                llvm::Twine(T) + ", B=" + llvm::Twine(B));
  if (seq.inputs.size() != inputSlots.size())
    return fail("expected " + llvm::Twine(inputSlots.size()) + " inputs, got " +
                llvm::Twine(seq.inputs.size()));
  if (seq.params.size() != paramSlots.size())
    return fail("expected " + llvm::Twine(paramSlots.size()) + " params, got " +
                llvm::Twine(seq.params.size()));
  if (!seq.initialStates.empty() && seq.initialStates.size() != stateSlots.size())
    return fail("expected " + llvm::Twine(stateSlots.size()) +
                " initial states, got " + llvm::Twine(seq.initialStates.size()));
  if (outputs.size() != outputSlots.size() || finalStates.size() != stateSlots.size())
    return fail("expected " + llvm::Twine(outputSlots.size()) + " outputs and " +
                llvm::Twine(stateSlots.size()) + " final states");
  for (auto [i, slot] : llvm::enumerate(inputSlots))
    if (auto e = checkArray(seq.inputs[i], {T, B, slot.shape[0]}, eb,
                            "input '" + slot.name + "'"))
      return e;
  for (auto [i, slot] : llvm::enumerate(paramSlots))
    if (auto e = checkArray(seq.params[i], slot.shape, eb, "param '" + slot.name + "'"))
      return e;
  for (auto [i, slot] : llvm::enumerate(stateSlots)) {
    if (!seq.initialStates.empty())
      if (auto e = checkArray(seq.initialStates[i], {B, slot.shape[0]}, eb,
                              "initial state '" + slot.name + "'", true))
        return e;
    if (auto e = checkArray(finalStates[i], {B, slot.shape[0]}, eb,
                            "final state '" + slot.name + "'"))
      return e;
  }
  for (auto [i, slot] : llvm::enumerate(outputSlots))
    if (auto e = checkArray(outputs[i], {T, B, slot.shape[0]}, eb,
                            "output '" + slot.name + "'"))
      return e;
  if (mode.kind == Recompute::Kind::Chunk && mode.chunk < 1)
    return fail("chunk:K needs K >= 1");

  Defaults defaults(seq, stateSlots, T, B, eb);
  const uint8_t *resets = defaults.resets;
  const std::vector<void *> &initial = defaults.initial;

  // The hoisted projections: one GEMM each over all T*B rows.
  std::vector<Scratch> projected;
  for (const Projection &p : im.projections)
    projected.push_back(project(p, seq, 0, T, B, elementType));

  bool training = saved != nullptr;
  bool saveGates = training && mode.kind == Recompute::Kind::None;
  int64_t K = mode.kind == Recompute::Kind::Chunk && training
                  ? std::min(mode.chunk, T)
                  : T;
  int64_t chunks = (T + K - 1) / K;
  SavedPtr keep(new Saved());
  keep->mode = mode;
  keep->steps = T;
  keep->batch = B;
  keep->chunkSteps = K;

  Scratch gates(std::vector<int64_t>{saveGates ? T : 1, saveGates ? B : 1,
                                     std::max<int64_t>(im.gatesWidth, 1)},
                eb, /*zero=*/false);
  std::vector<Scratch> history;
  for (const Slot &slot : stateSlots)
    history.emplace_back(std::vector<int64_t>{K, B, slot.shape[0]}, eb, false);
  // Chunked: the state before each chunk.
  std::vector<Scratch> boundaries;
  if (K < T)
    for (const Slot &slot : stateSlots)
      boundaries.emplace_back(std::vector<int64_t>{chunks, B, slot.shape[0]}, eb,
                              false);
  std::vector<Scratch> start;
  for (const Slot &slot : stateSlots)
    start.emplace_back(std::vector<int64_t>{B, slot.shape[0]}, eb);
  for (auto [i, slot] : llvm::enumerate(stateSlots))
    std::memcpy(start[i].data(), initial[i], B * slot.shape[0] * eb);

  JitKernels &kernels = saveGates ? *im.saving : *im.replaying;
  for (int64_t c = 0; c < chunks; ++c) {
    int64_t t0 = c * K, len = std::min(K, T - t0);
    std::vector<void *> chunkProjections, starts, histories, chunkOutputs;
    for (auto [p, proj] : llvm::enumerate(im.projections))
      chunkProjections.push_back(at(projected[p].data(), t0 * B * proj.rows, eb));
    for (auto [i, slot] : llvm::enumerate(stateSlots)) {
      int64_t n = slot.shape[0];
      if (!boundaries.empty())
        std::memcpy(at(boundaries[i].data(), c * B * n, eb), start[i].data(), B * n * eb);
      starts.push_back(start[i].data());
      histories.push_back(history[i].data());
    }
    for (auto [i, slot] : llvm::enumerate(outputSlots))
      chunkOutputs.push_back(at(outputs[i].data, t0 * B * slot.shape[0], eb));
    void *chunkGates = saveGates ? at(gates.data(), t0 * B * im.gatesWidth, eb)
                                 : gates.data();
    if (auto e = runForwardChunk(kernels, seq, t0, len, B, resets, chunkProjections,
                                 initial, starts, histories, chunkOutputs,
                                 chunkGates))
      return e;
    // The next chunk starts where this one ended.
    for (auto [i, slot] : llvm::enumerate(stateSlots)) {
      int64_t n = slot.shape[0];
      std::memcpy(start[i].data(), at(history[i].data(), (len - 1) * B * n, eb),
                  B * n * eb);
    }
  }
  for (auto [i, slot] : llvm::enumerate(stateSlots))
    std::memcpy(finalStates[i].data, start[i].data(), B * slot.shape[0] * eb);

  if (!training)
    return llvm::Error::success();
  if (K < T) {
    keep->states = std::move(boundaries);
  } else {
    keep->states = std::move(history);
    if (saveGates)
      keep->gates = std::move(gates);
  }
  *saved = std::move(keep);
  return llvm::Error::success();
}

llvm::Error CpuCell::backwardTimeMajor(const Sequence &seq, const Saved &saved,
                                       const std::vector<Array> &gradOutputs,
                                       const std::vector<Array> &gradFinalStates,
                                       const std::vector<Array> &gradInputs,
                                       const std::vector<Array> &gradParams,
                                       const std::vector<Array> &gradInitialStates) {
  Impl &im = *impl;
  int64_t eb = elementBytes();
  int64_t T = saved.steps, B = saved.batch;
  const Recompute &mode = saved.mode;
  if (gradOutputs.size() != outputSlots.size() ||
      gradFinalStates.size() != stateSlots.size() ||
      gradInputs.size() != inputSlots.size() ||
      gradParams.size() != paramSlots.size() ||
      gradInitialStates.size() != stateSlots.size())
    return fail("backward expects one gradient buffer per output, final "
                "state, input, param and initial state");
  for (auto [i, slot] : llvm::enumerate(outputSlots))
    if (auto e = checkArray(gradOutputs[i], {T, B, slot.shape[0]}, eb,
                            "gradient of output '" + slot.name + "'", true))
      return e;
  for (auto [i, slot] : llvm::enumerate(stateSlots)) {
    if (auto e = checkArray(gradFinalStates[i], {B, slot.shape[0]}, eb,
                            "gradient of final state '" + slot.name + "'", true))
      return e;
    if (auto e = checkArray(gradInitialStates[i], {B, slot.shape[0]}, eb,
                            "gradient of initial state '" + slot.name + "'", true))
      return e;
  }
  for (auto [i, slot] : llvm::enumerate(inputSlots))
    if (auto e = checkArray(gradInputs[i], {T, B, slot.shape[0]}, eb,
                            "gradient of input '" + slot.name + "'", true))
      return e;
  for (auto [i, slot] : llvm::enumerate(paramSlots))
    if (auto e = checkArray(gradParams[i], slot.shape, eb,
                            "gradient of param '" + slot.name + "'", true))
      return e;
  for (auto [i, slot] : llvm::enumerate(inputSlots))
    if (seq.inputs.size() != inputSlots.size() ||
        seq.inputs[i].shape != std::vector<int64_t>{T, B, slot.shape[0]})
      return fail("backward must see the forward's inputs");

  Defaults defaults(seq, stateSlots, T, B, eb);
  const uint8_t *resets = defaults.resets;
  const std::vector<void *> &initial = defaults.initial;

  // Accumulators: params, inputs and initial states, and the gradient that
  // flows into the end of the chunk being worked on.
  std::vector<Scratch> dParams, dInputs, dInitial, carry;
  for (const Slot &slot : paramSlots)
    dParams.emplace_back(slot.shape, eb);
  for (const Slot &slot : inputSlots)
    dInputs.emplace_back(std::vector<int64_t>{T, B, slot.shape[0]}, eb);
  for (auto [i, slot] : llvm::enumerate(stateSlots)) {
    dInitial.emplace_back(std::vector<int64_t>{B, slot.shape[0]}, eb);
    carry.emplace_back(std::vector<int64_t>{B, slot.shape[0]}, eb);
    if (gradFinalStates[i].data)
      std::memcpy(carry[i].data(), gradFinalStates[i].data, B * slot.shape[0] * eb);
  }
  std::vector<Scratch> zeroOutputGrads;
  for (auto [i, slot] : llvm::enumerate(outputSlots))
    if (!gradOutputs[i].data)
      zeroOutputGrads.emplace_back(std::vector<int64_t>{T, B, slot.shape[0]}, eb);

  int64_t K = saved.chunkSteps;
  bool chunked = K < T;
  int64_t chunks = (T + K - 1) / K;
  // Unchunked and without saved gates (full, or chunk:K with K >= T): replay.
  bool replay = !chunked && mode.kind != Recompute::Kind::None;
  JitKernels &kernels = replay ? *im.replaying : *im.saving;
  std::vector<Scratch> dummy;

  for (int64_t c = chunks - 1; c >= 0; --c) {
    int64_t t0 = c * K, len = std::min(K, T - t0);
    // The projections for this chunk, when the step is replayed.
    std::vector<Scratch> projected;
    for (const Projection &p : im.projections) {
      if (mode.kind == Recompute::Kind::None) {
        projected.emplace_back(std::vector<int64_t>{1, 1, 1}, eb);
        continue;
      }
      projected.push_back(project(p, seq, t0, len, B, elementType));
    }

    // The chunk's states and gates: saved, or recomputed by a forward pass
    // over the chunk that saves its gates.
    std::vector<void *> history, start;
    void *gates = nullptr;
    std::vector<Scratch> chunkHistory, chunkOutputs;
    Scratch chunkGates;
    if (chunked) {
      for (auto [i, slot] : llvm::enumerate(stateSlots)) {
        int64_t n = slot.shape[0];
        chunkHistory.emplace_back(std::vector<int64_t>{len, B, n}, eb, false);
        history.push_back(chunkHistory.back().data());
        start.push_back(at(const_cast<Saved &>(saved).states[i].data(), c * B * n, eb));
      }
      for (const Slot &slot : outputSlots)
        chunkOutputs.emplace_back(std::vector<int64_t>{len, B, slot.shape[0]}, eb,
                                  false);
      chunkGates = Scratch(
          std::vector<int64_t>{len, B, std::max<int64_t>(im.gatesWidth, 1)}, eb,
          /*zero=*/false);
      gates = chunkGates.data();
      std::vector<void *> chunkProjections, outputsOfChunk;
      for (Scratch &p : projected)
        chunkProjections.push_back(p.data());
      for (Scratch &o : chunkOutputs)
        outputsOfChunk.push_back(o.data());
      if (auto e = runForwardChunk(*im.saving, seq, t0, len, B, resets,
                                   chunkProjections, initial, start, history,
                                   outputsOfChunk, gates))
        return e;
    } else {
      for (auto [i, slot] : llvm::enumerate(stateSlots)) {
        history.push_back(const_cast<Saved &>(saved).states[i].data());
        start.push_back(initial[i]);
      }
      gates = mode.kind == Recompute::Kind::None
                  ? const_cast<Saved &>(saved).gates.data()
                  : nullptr;
      if (!gates) {
        dummy.emplace_back(std::vector<int64_t>{1}, eb);
        gates = dummy.back().data();
      }
    }

    // The backward kernel's arguments, in its order, with scratch for what it
    // writes.
    std::vector<Scratch> results;
    struct Written {
      ArgKind kind;
      std::string name;
      size_t result;
    };
    std::vector<Written> written;
    std::vector<KernelArg> args;
    size_t projection = 0, outputGrad = 0, zeroGrad = 0;
    std::map<size_t, size_t> resultOfArg;
    auto slotIndex = [](const std::vector<Slot> &slots, const std::string &name) {
      for (auto [i, s] : llvm::enumerate(slots))
        if (s.name == name)
          return i;
      return size_t(0);
    };
    results.reserve(im.bwd.size());
    for (const ArgInfo &arg : im.bwd) {
      ArgKind k = arg.kind;
      auto perStep = [&](int64_t n) { return std::vector<int64_t>{len, B, n}; };
      if (k == ArgKind::Input) {
        size_t i = slotIndex(inputSlots, arg.name);
        int64_t n = inputSlots[i].shape[0];
        args.push_back(KernelArg::buffer(at(seq.inputs[i].data, t0 * B * n, eb), perStep(n)));
      } else if (k == ArgKind::Projection) {
        size_t p = projection++;
        args.push_back(KernelArg::buffer(
            projected[p].data(),
            mode.kind == Recompute::Kind::None
                ? std::vector<int64_t>{len, B, im.projections[p].rows}
                : perStep(im.projections[p].rows)));
      } else if (k == ArgKind::Resets) {
        args.push_back(KernelArg::buffer(const_cast<uint8_t *>(resets + t0 * B), {len, B}));
      } else if (k == ArgKind::InitialState || k == ArgKind::StartState ||
                 k == ArgKind::FinalStateGrad) {
        size_t i = slotIndex(stateSlots, arg.name);
        void *data = k == ArgKind::InitialState ? initial[i]
                     : k == ArgKind::StartState ? start[i]
                                          : carry[i].data();
        args.push_back(KernelArg::buffer(data, {B, stateSlots[i].shape[0]}));
      } else if (k == ArgKind::Param) {
        size_t i = slotIndex(paramSlots, arg.name);
        args.push_back(KernelArg::buffer(seq.params[i].data, paramSlots[i].shape));
      } else if (k == ArgKind::StateHistory) {
        size_t i = slotIndex(stateSlots, arg.name);
        int64_t n = stateSlots[i].shape[0];
        void *data = chunked ? history[i] : at(history[i], t0 * B * n, eb);
        args.push_back(KernelArg::buffer(data, perStep(n)));
      } else if (k == ArgKind::Gates) {
        void *data = chunked || mode.kind != Recompute::Kind::None
                         ? gates
                         : at(gates, t0 * B * im.gatesWidth, eb);
        args.push_back(KernelArg::buffer(data, perStep(im.gatesWidth)));
      } else if (k == ArgKind::OutputGrad) {
        size_t i = outputGrad++;
        int64_t n = outputSlots[i].shape[0];
        void *data = gradOutputs[i].data ? gradOutputs[i].data
                                         : zeroOutputGrads[zeroGrad++].data();
        args.push_back(KernelArg::buffer(at(data, t0 * B * n, eb), perStep(n)));
      } else if (k == ArgKind::BatchBegin || k == ArgKind::BatchEnd) {
        args.push_back(KernelArg::indexValue(0));
      } else if (arg.sameAs >= 0) {
        // The same values as an earlier result: its buffer.
        size_t result = resultOfArg.at(arg.sameAs);
        written.push_back({k, arg.name, result});
        args.push_back(args[arg.sameAs]);
      } else {
        // Something the kernel writes.
        std::vector<int64_t> shape = arg.shape;
        for (auto [d, size] : llvm::enumerate(shape))
          if (size < 0)
            size = shape.size() == 3 && d == 0 ? len : B;
        results.emplace_back(shape, eb, /*zero=*/false);
        resultOfArg[args.size()] = results.size() - 1;
        // A zero result adds nothing to what it is folded into (weight rows
        // and vectors go in pairs, so they stay).
        if (!arg.zero || k == ArgKind::WeightRows || k == ArgKind::WeightVectors)
          written.push_back({k, arg.name, results.size() - 1});
        args.push_back(KernelArg::buffer(results.back().data(), shape));
      }
    }
    if (auto e = runKernel(kernels, "_bwd", std::move(args), B))
      return e;

    // Fold what the kernel wrote into the accumulators, with the GEMMs for
    // the weight, bias and input gradients.
    size_t projectionGrad = 0;
    for (size_t w = 0; w < written.size(); ++w) {
      const Written &out = written[w];
      Scratch &r = results[out.result];
      if (out.kind == ArgKind::InitialStateGrad) {
        size_t i = slotIndex(stateSlots, out.name);
        addColumnSums(elementType, r.data(), 1, B * stateSlots[i].shape[0],
                      dInitial[i].data());
      } else if (out.kind == ArgKind::StartStateGrad) {
        size_t i = slotIndex(stateSlots, out.name);
        std::memcpy(carry[i].data(), r.data(), B * stateSlots[i].shape[0] * eb);
      } else if (out.kind == ArgKind::InputGrad) {
        size_t i = slotIndex(inputSlots, out.name);
        int64_t n = inputSlots[i].shape[0];
        addColumnSums(elementType, r.data(), 1, len * B * n,
                      at(dInputs[i].data(), t0 * B * n, eb));
      } else if (out.kind == ArgKind::ProjectionGrad) {
        const Projection &p = im.projections[projectionGrad++];
        void *x = at(seq.inputs[p.input].data, t0 * B * p.cols, eb);
        gemm(elementType, true, false, p.rows, p.cols, len * B, r.data(),
             p.rows, x, p.cols, 1.0, dParams[p.weight].data(), p.cols);
        gemm(elementType, false, false, len * B, p.cols, p.rows, r.data(),
             p.rows, seq.params[p.weight].data, p.cols, 1.0,
             at(dInputs[p.input].data(), t0 * B * p.cols, eb), p.cols);
        // Every bias of the projection has the same gradient: sum the rows
        // once (an LSTM's b_ih and b_hh).
        if (!p.biases.empty()) {
          Scratch sums(std::vector<int64_t>{p.rows}, eb);
          addColumnSums(elementType, r.data(), len * B, p.rows, sums.data());
          for (size_t b : p.biases)
            addColumnSums(elementType, sums.data(), 1, p.rows, dParams[b].data());
        }
      } else if (out.kind == ArgKind::WeightRows) {
        // The next written buffer holds the matching vectors.
        Scratch &vecs = results[written[w + 1].result];
        size_t i = slotIndex(paramSlots, out.name);
        int64_t rows = paramSlots[i].shape[0], cols = paramSlots[i].shape[1];
        gemm(elementType, true, false, rows, cols, len * B, r.data(), rows,
             vecs.data(), cols, 1.0, dParams[i].data(), cols);
        ++w;
      } else if (out.kind == ArgKind::ParamGrad) {
        size_t i = slotIndex(paramSlots, out.name);
        addColumnSums(elementType, r.data(), B, paramSlots[i].shape[0],
                      dParams[i].data());
      }
    }
  }
  // What flows into the start of the first chunk belongs to the initial state.
  for (auto [i, slot] : llvm::enumerate(stateSlots))
    addColumnSums(elementType, carry[i].data(), 1, B * slot.shape[0],
                  dInitial[i].data());

  auto copyOut = [&](const std::vector<Array> &to, std::vector<Scratch> &from) {
    for (auto [i, array] : llvm::enumerate(to))
      if (array.data)
        std::memcpy(array.data, from[i].data(), product(array.shape) * eb);
  };
  copyOut(gradInputs, dInputs);
  copyOut(gradParams, dParams);
  copyOut(gradInitialStates, dInitial);
  return llvm::Error::success();
}
