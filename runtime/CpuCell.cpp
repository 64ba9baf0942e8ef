//===- CpuCell.cpp - Run a cell on the CPU: forward, backward, modes ------===//
//
// Compiles a cell's kernels for the host and runs them through the sequence
// driver (runtime/driver), whose CPU backend is here: memory from a pool,
// OpenBLAS for the GEMMs, the JIT's kernels on a batch tile per thread.
// Over 800 lines: the backend, the compile (kernel choice, the JIT and its
// cache) and the configs all read CpuCell::Impl, which this file keeps
// private.
//
//===----------------------------------------------------------------------===//

#include "runtime/CpuCell.h"
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
#include "llvm/Support/WithColor.h"
#include "llvm/Config/llvm-config.h"
#include "llvm/TargetParser/Host.h"

#include <cblas.h>
#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <map>
#include <mutex>
#include <thread>

using namespace cellc;
using namespace cellc::runtime;
using driver::View;

namespace {

llvm::Error fail(const llvm::Twine &message) {
  return llvm::createStringError(llvm::inconvertibleErrorCode(), message);
}

llvm::Error errorOf(const driver::Status &status) {
  return status ? fail(status.message()) : llvm::Error::success();
}

std::string shapeStr(llvm::ArrayRef<int64_t> shape) {
  std::string s = "[";
  for (auto [i, d] : llvm::enumerate(shape))
    s += (i ? ", " : "") + std::to_string(d);
  return s + "]";
}

/// The driver's buffers. Large ones are pages of their own (mmap), so that
/// what the driver releases goes back to the system at once: the heap's free
/// lists would keep it resident, and a later buffer of another size would
/// not fit in it. The driver allocates once a call what it reuses over the
/// pieces, so fresh pages fault once a call, not once a piece. What a
/// process holds is then what the driver's ledger says.
constexpr int64_t kMappedBytes = int64_t(64) << 10;
constexpr int64_t kHugePage = int64_t(2) << 20;

void *allocateBytes(int64_t bytes, bool zero) {
  bytes = std::max<int64_t>(bytes, 1);
  if (bytes < kMappedBytes)
    return zero ? std::calloc(bytes, 1) : std::malloc(bytes);
  // Fresh pages are zeros. Huge ones where the system gives them: a fresh
  // buffer faults once every 2 MiB, not every 4 KiB.
  void *buffer =
      mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (buffer == MAP_FAILED)
    return nullptr;
  if (bytes >= kHugePage)
    madvise(buffer, bytes, MADV_HUGEPAGE);
  return buffer;
}

void releaseBytes(void *buffer, int64_t bytes) {
  bytes = std::max<int64_t>(bytes, 1);
  if (bytes < kMappedBytes)
    std::free(buffer);
  else
    munmap(buffer, bytes);
}

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

llvm::Expected<Recompute> Recompute::parse(llvm::StringRef text) {
  if (std::optional<driver::Recompute> mode = driver::Recompute::parse(text.str())) {
    Recompute r;
    static_cast<driver::Recompute &>(r) = *mode;
    return r;
  }
  return fail("unknown recompute mode '" + text +
              "'; expected none, full or chunk:K with K > 0");
}

namespace {


/// The sequence driver's CPU backend: memory from the pool, OpenBLAS, and the
/// JIT's kernels on a batch tile per thread.
class CpuBackend : public driver::Backend {
public:
  CpuBackend(DType dtype, std::string cell, JitKernels &saving, JitKernels &replaying,
             int threads)
      : threads(threads), dtype(dtype), cell(std::move(cell)), saving(saving),
        replaying(replaying) {}

  /// Threads for the kernels, from CpuCell::setThreads.
  std::atomic<int> threads;

  driver::Status allocate(int64_t elements, driver::Element element, bool zero,
                          driver::Buffer &out) override {
    int64_t bytes = elements * driver::bytesOf(element);
    out.data = allocateBytes(bytes, zero);
    if (!out.data)
      return driver::Status::error("out of memory: a buffer of " + std::to_string(bytes) +
                                   " bytes");
    // The id keeps the size, for release.
    out.id = bytes;
    out.element = element;
    return driver::Status();
  }
  void release(const driver::Buffer &buffer) override {
    releaseBytes(buffer.data, buffer.id);
  }
  int64_t instances(int64_t batch) const override {
    return std::max<int64_t>(1, std::min<int64_t>(threads, batch));
  }

  driver::Status launch(bool backward, bool saveGates,
                        const std::vector<driver::Arg> &args,
                        int64_t batch) override {
    std::vector<KernelArg> base;
    size_t first = size_t(-1);
    for (const driver::Arg &arg : args) {
      if (arg.index) {
        if (first == size_t(-1))
          first = base.size();
        base.push_back(KernelArg::indexValue(*arg.index));
        continue;
      }
      base.push_back(KernelArg::buffer(arg.view.pointer(), arg.view.shape));
    }
    if (first == size_t(-1) || first + 1 >= base.size())
      return driver::Status::error("internal error: a kernel without b_begin, b_end");
    std::string name = cell + (backward ? "_bwd" : "_fwd");
    JitKernels &kernels = saveGates ? saving : replaying;
    llvm::Error e = parallelBatches(batch, threads, [&](int64_t b0, int64_t b1) {
      std::vector<KernelArg> mine = base;
      mine[first] = KernelArg::indexValue(b0);
      mine[first + 1] = KernelArg::indexValue(b1);
      return kernels.call(name, mine);
    });
    if (e)
      return driver::Status::error(llvm::toString(std::move(e)));
    return driver::Status();
  }

  driver::Status gemm(bool transA, bool transB, int64_t m, int64_t n, int64_t k,
                      const View &a, int64_t lda, const View &b, int64_t ldb,
                      double beta, const View &c, int64_t ldc) override {
    ::gemm(dtype, transA, transB, m, n, k, a.pointer(), lda, b.pointer(), ldb, beta,
           c.pointer(), ldc);
    return driver::Status();
  }
  driver::Status columnSums(const View &m, int64_t rows, int64_t cols,
                            const View &acc) override {
    addColumnSums(dtype, m.pointer(), rows, cols, acc.pointer());
    return driver::Status();
  }
  driver::Status fillRows(const View &m, int64_t rows, int64_t cols,
                          const std::vector<View> &vectors) override {
    std::vector<const void *> pointers;
    for (const View &v : vectors)
      pointers.push_back(v.pointer());
    ::fillRows(dtype, m.pointer(), rows, cols, pointers);
    return driver::Status();
  }
  driver::Status copy(const View &from, const View &to) override {
    if (from.element() != to.element())
      return driver::Status::error("internal error: the CPU backend copies one type");
    std::memcpy(to.pointer(), from.pointer(), from.size() * driver::bytesOf(from.element()));
    return driver::Status();
  }
  driver::Status add(const View &from, const View &to) override {
    addColumnSums(dtype, from.pointer(), 1, from.size(), to.pointer());
    return driver::Status();
  }

private:
  DType dtype;
  std::string cell;
  JitKernels &saving, &replaying;
};

/// A caller's buffer as a view, checked: present (unless optional), aligned,
/// and of the expected shape.
/// The caller's arrays as the driver's views (null data: an invalid view),
/// named after their slots. The driver checks their count and shapes; here
/// only what a pointer can get wrong, the alignment.
llvm::Error viewsOf(const std::vector<Array> &arrays, const std::vector<Slot> &slots,
                    driver::Element element, llvm::StringRef what,
                    std::vector<View> &out) {
  int64_t eb = driver::bytesOf(element);
  out.clear();
  for (auto [i, array] : llvm::enumerate(arrays)) {
    View v;
    if (array.data) {
      if (reinterpret_cast<uintptr_t>(array.data) % eb != 0)
        return fail(what + " '" + (i < slots.size() ? slots[i].name : "?") +
                    "' is not aligned to its " + llvm::Twine(eb) + "-byte elements");
      v.buffer.data = array.data;
      v.buffer.element = element;
      v.shape = array.shape;
    }
    out.push_back(v);
  }
  return llvm::Error::success();
}

/// The driver's view of per-step reset bytes [T, B] (none: invalid).
View resetsOf(const uint8_t *resets, int64_t T, int64_t B) {
  View v;
  if (resets) {
    v.buffer.data = const_cast<uint8_t *>(resets);
    v.buffer.element = driver::Element::U8;
    v.shape = {T, B};
  }
  return v;
}

driver::Element elementOf(DType dtype) {
  return dtype == DType::F32 ? driver::Element::F32 : driver::Element::F64;
}

/// The driver's sequence over a time-major `seq` of T steps of B rows.
llvm::Error driverSequence(const cellc::runtime::CpuCell &cell,
                           const cellc::runtime::CpuCell::Sequence &seq, int64_t T,
                           int64_t B, driver::Element e, driver::Sequence &s) {
  s.steps = T;
  s.batch = B;
  s.resets = resetsOf(seq.resets, T, B);
  s.lengths = seq.lengths;
  if (auto err = viewsOf(seq.inputs, cell.inputs(), e, "input", s.inputs))
    return err;
  if (auto err = viewsOf(seq.params, cell.params(), e, "param", s.params))
    return err;
  return viewsOf(seq.initialStates, cell.states(), e, "initial state",
                 s.initialStates);
}

} // namespace


//===----------------------------------------------------------------------===//
// CpuCell
//===----------------------------------------------------------------------===//

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


int64_t CpuCell::savedBytes(const Saved &saved) { return driver::savedBytes(saved); }

struct CpuCell::Impl {
  std::string name;
  std::unique_ptr<JitKernels> saving, replaying;
  driver::Interface interface;
  std::shared_ptr<CpuBackend> backend;
  std::unique_ptr<driver::SequenceDriver> driver;
  int64_t pieceRows = driver::SequenceDriver::kPieceRows;
};

CpuCell::CpuCell(std::unique_ptr<Impl> impl) : impl(std::move(impl)) {}
CpuCell::~CpuCell() = default;

driver::MemoryStats CpuCell::memoryStats() const { return impl->driver->stats(); }

llvm::Expected<driver::MemoryPlan> CpuCell::memoryPlan(int64_t steps, int64_t batch,
                                                       Recompute mode) const {
  if (steps < 1 || batch < 1)
    return fail("a memory plan needs steps >= 1 and batch >= 1");
  driver::MemoryPlan plan;
  if (auto err = errorOf(driver::SequenceDriver::plan(
          impl->driver->interface(), steps, batch, mode, plan, impl->pieceRows,
          impl->backend->instances(batch))))
    return std::move(err);
  return plan;
}

void CpuCell::setThreads(int threads) {
  numThreads = threads > 0 ? threads
                           : std::max(1u, std::thread::hardware_concurrency());
  if (impl && impl->backend)
    impl->backend->threads = numThreads;
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
    return src.takeError();
  mlir::SourceMgrDiagnosticHandler handler(src.sourceMgr, &context, os);

  auto impl = std::make_unique<Impl>();
  std::unique_ptr<CpuCell> cell(new CpuCell(nullptr));
  cell->elementType = dtype;
  // A tuned config for this cell, machine and batch bucket replaces the
  // knobs given.
  if (options.useTuned && options.batchHint > 0) {
    std::string key = tuningKey(source, sizes, dtype, options.batchHint,
                                TuneTarget::Cpu, deviceName(TuneTarget::Cpu));
    auto tuned = lookupTuned(key, TuneTarget::Cpu, options.cacheDir);
    if (!tuned) {
      // Lost tuning is worth a word, not a failure: the default config runs.
      llvm::WithColor::warning(llvm::errs(), "cellc")
          << llvm::toString(tuned.takeError())
          << "; it is ignored and the default config used (cellc-tune writes it again)\n";
    } else if (*tuned) {
      applyConfig(**tuned, options);
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
    if (llvm::Error e = readKernels(*copy, impl->name, saveGates, impl->interface))
      return std::move(e);
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

  // The driver runs the kernels through their interface.
  impl->interface.compute =
      dtype == DType::F32 ? driver::Element::F32 : driver::Element::F64;
  if (driver::Status e = impl->interface.finish())
    return fail(e.message());
  impl->backend = std::make_shared<CpuBackend>(
      dtype, impl->name, *impl->saving, *impl->replaying, cell->numThreads);
  impl->driver = std::make_unique<driver::SequenceDriver>(std::move(impl->interface),
                                                          impl->backend);
  impl->pieceRows =
      options.pieceRows > 0 ? options.pieceRows : driver::SequenceDriver::kPieceRows;
  impl->driver->setPieceRows(impl->pieceRows);
  cell->impl = std::move(impl);
  return cell;
}

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

/// Batch-first buffers turned time-major ([B, T, n] → [T, B, n]): owns the
/// copies.
class TimeMajor {
public:
  explicit TimeMajor(int64_t elementBytes) : eb(elementBytes) {}

  /// The time-major view of a batch-first sequence, after checking its
  /// inputs; T and B come from them.
  llvm::Expected<cellc::runtime::CpuCell::Sequence>
  sequence(const cellc::runtime::CpuCell::Sequence &seq) {
    if (seq.inputs.empty() || seq.inputs[0].shape.size() != 3)
      return fail("batch-first sequences need inputs of shape [B, T, n]");
    B = seq.inputs[0].shape[0];
    T = seq.inputs[0].shape[1];
    cellc::runtime::CpuCell::Sequence inner = seq;
    inner.batchFirst = false;
    if (auto e = convert(seq.inputs, "input", /*copy=*/true, inner.inputs))
      return std::move(e);
    if (seq.resets) {
      resets.resize(T * B);
      swapLeadingDims(seq.resets, resets.data(), B, T, 1);
      inner.resets = resets.data();
    }
    return inner;
  }

  /// Time-major buffers for batch-first `arrays` (missing ones stay
  /// missing), holding their values when `copy`.
  llvm::Error convert(const std::vector<Array> &arrays, const char *what, bool copy,
                      std::vector<Array> &out) {
    out.clear();
    for (const Array &a : arrays) {
      if (!a.data) {
        out.push_back(a);
        continue;
      }
      if (a.shape.size() != 3 || a.shape[0] != B || a.shape[1] != T)
        return fail(llvm::Twine("batch-first ") + what + " has shape " +
                    shapeStr(a.shape) + ", expected [" + llvm::Twine(B) + ", " +
                    llvm::Twine(T) + ", n]");
      int64_t n = a.shape[2];
      storage.emplace_back((B * T * n * eb + 7) / 8 + 1);
      if (copy)
        swapLeadingDims(a.data, storage.back().data(), B, T, n * eb);
      out.push_back({storage.back().data(), {T, B, n}});
    }
    return llvm::Error::success();
  }

  /// Copies what the kernels wrote into `inner` back to the batch-first
  /// `arrays` it was converted from.
  void copyBack(const std::vector<Array> &inner, const std::vector<Array> &arrays) {
    for (auto [i, a] : llvm::enumerate(arrays))
      if (a.data)
        swapLeadingDims(inner[i].data, a.data, T, B, a.shape[2] * eb);
  }

private:
  int64_t eb, T = 0, B = 0;
  std::vector<std::vector<double>> storage;
  std::vector<uint8_t> resets;
};

/// `seq` time-major: itself, or a copy made by `tm` when batch-first.
llvm::Error timeMajor(const cellc::runtime::CpuCell::Sequence &seq, int64_t eb,
                      std::optional<TimeMajor> &tm,
                      cellc::runtime::CpuCell::Sequence &out) {
  if (!seq.batchFirst) {
    out = seq;
    return llvm::Error::success();
  }
  tm.emplace(eb);
  auto inner = tm->sequence(seq);
  if (!inner)
    return inner.takeError();
  out = std::move(*inner);
  return llvm::Error::success();
}
} // namespace

std::vector<driver::KeptBuffer> CpuCell::keptLayout(Recompute mode,
                                                   bool hasLengths) const {
  return impl->driver->keptLayout(mode, hasLengths, /*outputsOutliveSaved=*/true);
}

std::vector<size_t> CpuCell::keptOutputs(Recompute mode, bool hasLengths) const {
  std::vector<size_t> outputs;
  for (int64_t o : impl->driver->keptOutputs(mode, hasLengths, /*outputsOutliveSaved=*/true))
    if (o >= 0)
      outputs.push_back(size_t(o));
  return outputs;
}

namespace {
/// The caller's kept buffers as the driver's views, in the layout's element
/// types.
llvm::Error keptViews(const std::vector<driver::KeptBuffer> &layout,
                      const std::vector<Array> &kept, std::vector<View> &out) {
  if (kept.size() != layout.size())
    return fail("expected " + llvm::Twine(layout.size()) + " kept buffers, got " +
                llvm::Twine(kept.size()));
  out.clear();
  for (auto [i, array] : llvm::enumerate(kept)) {
    std::vector<Slot> names = {{"#" + std::to_string(i), {}}};
    std::vector<View> one;
    if (auto e = viewsOf({array}, names, layout[i].element, "kept buffer", one))
      return e;
    out.push_back(one[0]);
  }
  return llvm::Error::success();
}
} // namespace

llvm::Expected<SavedPtr> CpuCell::adopt(const Sequence &seq, Recompute mode,
                                        const std::vector<Array> &outputs,
                                        const std::vector<Array> &kept) const {
  if (seq.batchFirst)
    return fail("kept buffers are time-major only");
  if (seq.inputs.empty() || seq.inputs[0].shape.size() != 3)
    return fail("adopt needs the forward's inputs, [T, B, n]");
  int64_t T = seq.inputs[0].shape[0], B = seq.inputs[0].shape[1];
  driver::Element e = elementOf(elementType);
  driver::Sequence s;
  if (auto err = driverSequence(*this, seq, T, B, e, s))
    return std::move(err);
  std::vector<View> outs, keptIn;
  if (auto err = viewsOf(outputs, outputSlots, e, "output", outs))
    return std::move(err);
  if (auto err = keptViews(keptLayout(mode, !seq.lengths.empty()), kept, keptIn))
    return std::move(err);
  SavedPtr saved;
  if (auto err = errorOf(impl->driver->adopt(s, mode, outs, keptIn, saved)))
    return std::move(err);
  return saved;
}

llvm::Error CpuCell::forward(const Sequence &batchFirstOrNot,
                             const std::vector<Array> &callerOutputs,
                             const std::vector<Array> &finalStates, Recompute mode,
                             SavedPtr *saved, const std::vector<Array> *kept) {
  if (kept && (batchFirstOrNot.batchFirst || !saved))
    return fail("kept buffers need a time-major training forward");
  // Batch-first sequences run time-major, on copies.
  std::optional<TimeMajor> tm;
  Sequence seq;
  if (auto e = timeMajor(batchFirstOrNot, elementBytes(), tm, seq))
    return e;
  std::vector<Array> outputs = callerOutputs;
  if (tm) {
    if (auto e = tm->convert(callerOutputs, "output", /*copy=*/false, outputs))
      return e;
  }

  // T and B come from the first input, or are given.
  int64_t T = seq.steps, B = seq.batch;
  if (!seq.inputs.empty() && seq.inputs[0].shape.size() == 3) {
    T = seq.inputs[0].shape[0];
    B = seq.inputs[0].shape[1];
  }
  driver::Element e = elementOf(elementType);
  driver::Sequence s;
  if (auto err = driverSequence(*this, seq, T, B, e, s))
    return err;
  std::vector<View> outs, finals;
  if (auto err = viewsOf(finalStates, stateSlots, e, "final state", finals))
    return err;
  if (auto err = viewsOf(outputs, outputSlots, e, "output", outs))
    return err;
  std::vector<View> keptIn;
  if (kept)
    if (auto err = keptViews(keptLayout(mode, !seq.lengths.empty()), *kept, keptIn))
      return err;
  if (auto err = errorOf(impl->driver->forward(s, outs, finals, mode, saved,
                                               (seq.outputsOutliveSaved || kept) && !tm,
                                               kept ? &keptIn : nullptr)))
    return err;
  if (tm)
    tm->copyBack(outputs, callerOutputs);
  return llvm::Error::success();
}

llvm::Error CpuCell::backward(const Sequence &batchFirstOrNot, const Saved &saved,
                              const std::vector<Array> &gradOutputs,
                              const std::vector<Array> &gradFinalStates,
                              const std::vector<Array> &callerGradInputs,
                              const std::vector<Array> &gradParams,
                              const std::vector<Array> &gradInitialStates) {
  // Batch-first sequences run time-major, on copies.
  std::optional<TimeMajor> tm;
  Sequence seq;
  if (auto e = timeMajor(batchFirstOrNot, elementBytes(), tm, seq))
    return e;
  std::vector<Array> dOutputs = gradOutputs, gradInputs = callerGradInputs;
  if (tm) {
    if (auto e = tm->convert(gradOutputs, "output gradient", /*copy=*/true, dOutputs))
      return e;
    if (auto e = tm->convert(callerGradInputs, "input gradient", /*copy=*/false,
                             gradInputs))
      return e;
  }

  driver::Element e = elementOf(elementType);
  int64_t T = driver::savedSteps(saved), B = driver::savedBatch(saved);
  driver::Sequence s;
  if (auto err = driverSequence(*this, seq, T, B, e, s))
    return err;
  std::vector<View> dOut, dFinal, dIn, dPar, dInit;
  if (auto err = viewsOf(dOutputs, outputSlots, e, "gradient of output", dOut))
    return err;
  if (auto err = viewsOf(gradFinalStates, stateSlots, e, "gradient of final state",
                         dFinal))
    return err;
  if (auto err = viewsOf(gradInputs, inputSlots, e, "gradient of input", dIn))
    return err;
  if (auto err = viewsOf(gradParams, paramSlots, e, "gradient of param", dPar))
    return err;
  if (auto err = viewsOf(gradInitialStates, stateSlots, e,
                         "gradient of initial state", dInit))
    return err;
  if (auto err =
          errorOf(impl->driver->backward(s, saved, dOut, dFinal, dIn, dPar, dInit)))
    return err;
  if (tm)
    tm->copyBack(gradInputs, callerGradInputs);
  return llvm::Error::success();
}

//===----------------------------------------------------------------------===//
// Configs
//===----------------------------------------------------------------------===//

void cellc::runtime::applyConfig(const KernelConfig &config,
                                 CpuCell::Options &options) {
  auto get = [&](const char *name, int64_t fallback) {
    auto it = config.find(name);
    return it == config.end() ? fallback : it->second;
  };
  options.threads = get("threads", options.threads);
  options.kernels = get("kernels", 1) ? CpuCell::Options::Kernels::Batched
                                      : CpuCell::Options::Kernels::PerRow;
  options.batchTile = get("batch_tile", 0);
  options.productRows = get("product_rows", 0);
  options.productVectors = get("product_vectors", 0);
  options.matvecWidth = get("matvec_width", 0);
  options.matvecUnroll = get("matvec_unroll", 1);
}

KernelConfig cellc::runtime::configOf(const CpuCell::Options &options,
                                      int threads) {
  CpuCell::BatchedShape shape = CpuCell::batchedShape(options);
  return {{"threads", threads},
          {"kernels", CpuCell::usesBatchedKernels(options) ? 1 : 0},
          {"batch_tile", shape.tile},
          {"product_rows", shape.rows},
          {"product_vectors", shape.vectors},
          {"matvec_width", options.matvecWidth},
          {"matvec_unroll", options.matvecUnroll}};
}
