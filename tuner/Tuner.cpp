//===- Tuner.cpp - The autotuner: candidates, child processes, ptxas ------===//

#include "tuner/Tuner.h"

#include "compiler/Conversion/Common/PhasePlan.h"
#include "compiler/Frontend/Diagnostics.h"
#include "compiler/Frontend/IRGen.h"
#include "compiler/Pipelines/Pipelines.h"
#include "dialects/Cell/IR/CellDialect.h"
#include "dialects/Cell/IR/CellOps.h"
#include "dialects/Cell/IR/Knobs.h"
#include "jit/KernelCache.h"
#include "runtime/cuda/CudaDriver.h"
#include "tuner/Workload.h"

#include "mlir/IR/MLIRContext.h"
#include "mlir/Pass/PassManager.h"
#include "llvm/ADT/StringExtras.h"
#include "llvm/Support/ErrorHandling.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/FormatVariadic.h"
#include "llvm/Support/Path.h"
#include "llvm/Support/Program.h"
#include "llvm/TargetParser/Host.h"

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstring>
#include <iterator>
#include <poll.h>
#include <sys/wait.h>
#include <thread>
#include <unistd.h>

using namespace cellc;
using namespace cellc::tuner;

namespace {

llvm::Error fail(const llvm::Twine &message) {
  return llvm::createStringError(llvm::inconvertibleErrorCode(), message);
}

using Clock = std::chrono::steady_clock;
double since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

} // namespace


KernelConfig cellc::tuner::defaultConfig(TuneTarget target, int64_t batch) {
  if (target == TuneTarget::Cpu) {
    CpuOptions options;
    options.batchHint = batch;
    return configOf(options, std::min<int64_t>(cores(), std::max<int64_t>(1, batch)));
  }
  KernelConfig config;
  for (const CudaTuneKnob &knob : cudaTuneKnobs())
    config[knob.name] = knob.defaultValue;
  return config;
}

//===----------------------------------------------------------------------===//
// Candidates
//===----------------------------------------------------------------------===//

llvm::StringRef cellc::tuner::nameOf(Candidate::Status status) {
  static constexpr llvm::StringLiteral names[] = {
      "not timed", "ok",           "pruned",     "compile error",
      "crashed",   "wrong results", "over budget"};
  static_assert(std::size(names) == size_t(Candidate::Status::OverBudget) + 1);
  return names[size_t(status)];
}

namespace {

/// The recurrent products of a cell's step (after the projections are
/// split off): the [rows, cols] of every matvec's weight, and whether there
/// is any product (a transposed one, `v @ W`, too), as the batched pass
/// counts them.
struct RecurrentProducts {
  std::vector<std::pair<int64_t, int64_t>> matvecs;
  bool any = false;
};

llvm::Expected<RecurrentProducts> recurrentProducts(const TuneProblem &problem) {
  mlir::MLIRContext context;
  CellSource src(problem.source, problem.fileName);
  mlir::FloatType element =
      problem.dtype == DType::F32
          ? mlir::FloatType(mlir::Float32Type::get(&context))
          : mlir::FloatType(mlir::Float64Type::get(&context));
  auto module = compileCellSource(context, problem.sizes, element, src.diag);
  if (!module)
    return src.takeError();
  mlir::PassManager pm(&context);
  buildPipeline(pm, Stage::Split);
  if (mlir::failed(pm.run(*module)))
    return fail("cellc: splitting the projections failed");
  RecurrentProducts products;
  module->walk([&](mlir::Operation *op) {
    if (auto matvec = llvm::dyn_cast<mlir::cell::MatvecOp>(op)) {
      auto type = llvm::cast<mlir::RankedTensorType>(matvec.getWeight().getType());
      products.matvecs.push_back({type.getDimSize(0), type.getDimSize(1)});
    }
    // What the batched pass counts (its tileOf).
    products.any |= mlir::cell::PhasePlan::isProduct(op);
  });
  return products;
}

/// Why a CPU config cannot run the problem, or empty.
std::string cpuPruneReason(const KernelConfig &c, const TuneProblem &problem,
                           const RecurrentProducts &products) {
  if (c.at("kernels") == 0) {
    // The knob is the batched kernels': per-row kernels split rows only.
    if (c.count("unit_slices") && c.at("unit_slices") == 0)
      return "the per-row kernels have no unit slices";
    int64_t width = c.at("matvec_width"), unroll = c.at("matvec_unroll");
    for (auto [rows, cols] : products.matvecs) {
      if (width > 0 && cols % width)
        return llvm::formatv("matvec_width {0} does not divide {1} columns", width, cols);
      if (rows % unroll)
        return llvm::formatv("matvec_unroll {0} does not divide {1} rows", unroll, rows);
    }
  } else {
    int64_t rows = c.at("product_rows"), vectors = c.at("product_vectors");
    // Accumulators, a panel's vectors and a broadcast in the registers.
    int64_t registers = hostVectorRegisters();
    if (rows * vectors + vectors + 1 > registers)
      return llvm::formatv("a {0}x{1} block needs {2} vector registers; the host has {3}",
                           rows, vectors, rows * vectors + vectors + 1, registers);
    KernelConfig defaults = defaultConfig(TuneTarget::Cpu, problem.batch);
    // Without a recurrent product every tile is one row (the batched pass).
    if (!products.any && c.at("batch_tile") != defaults.at("batch_tile"))
      return "the step has no recurrent product: its tiles are one row";
    // A tile over the batch runs as one that holds it: the default's.
    if (c.at("batch_tile") > problem.batch &&
        c.at("batch_tile") != defaults.at("batch_tile"))
      return "batch_tile is over the batch";
  }
  if (c.at("threads") > problem.batch)
    return "more threads than batch rows";
  return "";
}

/// The legal values of the CPU config key `name` (Knobs.def, with this
/// machine's threads).
std::vector<int64_t> cpuValues(llvm::StringRef name) {
  for (const Knob &knob : knobsOf(TuneTarget::Cpu))
    if (knob.name == name)
      return knob.values;
  llvm::report_fatal_error("cellc-tune: Knobs.def lists no CPU key '" + name +
                           "'");
}

/// The kernel-shape candidates of stage one (threads fixed at the default):
/// the batched kernels' block at the default tile, their tile at the default
/// block, and the per-row kernels' matvec shapes.
std::vector<KernelConfig> cpuShapeCandidates(const KernelConfig &base) {
  std::vector<KernelConfig> out = {base};
  auto add = [&](KernelConfig c) {
    if (std::find(out.begin(), out.end(), c) == out.end())
      out.push_back(c);
  };
  KernelConfig batched = base;
  batched["kernels"] = 1;
  for (int64_t rows : cpuValues("product_rows"))
    for (int64_t vectors : cpuValues("product_vectors")) {
      KernelConfig c = batched;
      c["product_rows"] = rows;
      c["product_vectors"] = vectors;
      add(c);
    }
  for (int64_t tile : cpuValues("batch_tile")) {
    KernelConfig c = batched;
    c["batch_tile"] = tile;
    add(c);
  }
  for (int64_t width : cpuValues("matvec_width"))
    for (int64_t unroll : cpuValues("matvec_unroll")) {
      KernelConfig c = base;
      c["kernels"] = 0;
      c["matvec_width"] = width;
      c["matvec_unroll"] = unroll;
      add(c);
    }
  return out;
}

/// The test hook: `CELLC_TUNE_BREAK=kind:index,...` breaks candidate `index`
/// (as numbered in the table, from 1) by `kind`: compile, crash or wrong.
std::string injectedBreak(size_t index) {
  const char *spec = std::getenv("CELLC_TUNE_BREAK");
  if (!spec)
    return "";
  llvm::SmallVector<llvm::StringRef> parts;
  llvm::StringRef(spec).split(parts, ',');
  for (llvm::StringRef part : parts) {
    auto [kind, at] = part.split(':');
    size_t n;
    if (!at.getAsInteger(10, n) && n == index)
      return kind.str();
  }
  return "";
}

/// What a child process reports about one candidate.
struct Report {
  int status;
  int repeats;
  double medianMs;
  double error;
  char note[480];
};

/// Runs one CPU candidate: compiles, checks against `reference` and times.
Report runCandidate(const TuneProblem &problem, const KernelConfig &config,
                    const std::string &cacheDir, const Workload::Results &reference,
                    double seconds, const std::string &broken) {
  Report report{};
  auto note = [&](const std::string &text) {
    std::strncpy(report.note, text.c_str(), sizeof(report.note) - 1);
  };
  CpuOptions options;
  options.cacheDir = cacheDir;
  applyConfig(config, options);
  if (broken == "compile") {
    report.status = int(Candidate::Status::CompileError);
    note("injected compile failure (CELLC_TUNE_BREAK)");
    return report;
  }
  auto cell = compileCpu(problem.source, problem.fileName, problem.sizes,
                               problem.dtype, options);
  if (!cell) {
    report.status = int(Candidate::Status::CompileError);
    note(llvm::toString(cell.takeError()));
    return report;
  }
  if (broken == "crash") {
    // As a segfault in the kernels would end: handlers (Python's, LLVM's)
    // print and re-raise; the default action ends the process.
    std::signal(SIGSEGV, SIG_DFL);
    std::raise(SIGSEGV);
  }
  Recompute mode;
  mode.kind = problem.saveGates ? Recompute::Kind::None : Recompute::Kind::Full;
  Workload work(**cell, problem.steps, problem.batch, /*seed=*/1);
  if (auto kept = work.run(**cell, mode, true); !kept) {
    report.status = int(Candidate::Status::Crashed);
    note(llvm::toString(kept.takeError()));
    return report;
  }
  Workload::Results results = work.results();
  if (broken == "wrong")
    results[0][0] += 1.0;
  report.error = Workload::relativeError(results, reference);
  double tolerance = problem.dtype == DType::F32 ? 1e-3 : 1e-9;
  if (!(report.error <= tolerance)) {
    report.status = int(Candidate::Status::Wrong);
    note(llvm::formatv("differs from the default config by {0:e2} (relative)",
                       report.error)
             .str());
    return report;
  }
  std::vector<double> times;
  Clock::time_point start = Clock::now();
  while (times.size() < 3 || (since(start) < seconds && times.size() < 25)) {
    Clock::time_point t0 = Clock::now();
    if (auto kept = work.run(**cell, mode, true); !kept) {
      report.status = int(Candidate::Status::Crashed);
      note(llvm::toString(kept.takeError()));
      return report;
    }
    times.push_back(since(t0) * 1000);
  }
  std::sort(times.begin(), times.end());
  report.status = int(Candidate::Status::Ok);
  report.repeats = times.size();
  report.medianMs = times[times.size() / 2];
  return report;
}

/// Runs `work` in a child process and returns its report; a child that dies
/// or hangs is reported as crashed.
Report isolated(std::function<Report()> work, double timeoutSeconds) {
  Report report{};
  report.status = int(Candidate::Status::Crashed);
  int fds[2];
  if (pipe(fds) != 0) {
    std::strcpy(report.note, "cannot create a pipe");
    return report;
  }
  llvm::outs().flush();
  llvm::errs().flush();
  pid_t pid = fork();
  if (pid < 0) {
    close(fds[0]);
    close(fds[1]);
    std::strcpy(report.note, "cannot fork");
    return report;
  }
  if (pid == 0) {
    close(fds[0]);
    Report r = work();
    ssize_t ignored = write(fds[1], &r, sizeof(r));
    (void)ignored;
    _exit(0);
  }
  close(fds[1]);
  pollfd p{fds[0], POLLIN, 0};
  int ready = poll(&p, 1, int(timeoutSeconds * 1000));
  bool got = false;
  if (ready > 0)
    got = read(fds[0], &report, sizeof(report)) == ssize_t(sizeof(report));
  close(fds[0]);
  if (ready == 0)
    kill(pid, SIGKILL);
  int status = 0;
  waitpid(pid, &status, 0);
  if (got)
    return report;
  report.status = int(Candidate::Status::Crashed);
  std::string why = ready == 0 ? llvm::formatv("no result within {0:F0} s", timeoutSeconds).str()
                    : WIFSIGNALED(status)
                        ? std::string("killed by signal ") + std::to_string(WTERMSIG(status)) +
                              " (" + strsignal(WTERMSIG(status)) + ")"
                        : "exited with status " + std::to_string(WEXITSTATUS(status));
  std::strncpy(report.note, why.c_str(), sizeof(report.note) - 1);
  return report;
}

/// Compiles a CUDA candidate to PTX and reads ptxas -v; fills the
/// candidate's registers, spills and shared memory, or prunes it.
void compileCudaCandidate(const TuneProblem &problem, Candidate &candidate) {
  mlir::MLIRContext context;
  CellSource src(problem.source, problem.fileName);
  auto module = compileCellSource(context, problem.sizes,
                                  mlir::Float32Type::get(&context), src.diag);
  if (!module) {
    candidate.status = Candidate::Status::CompileError;
    candidate.note = src.diagnostics();
    return;
  }
  mlir::SourceMgrDiagnosticHandler handler(src.sourceMgr, &context, src.os);
  PipelineOptions options;
  options.saveGates = problem.saveGates;
  options.strategy = KernelStrategy::BatchTiled;
  options.target = Target::Cuda;
  // Each knob sets the option of its name (Knobs.def); warps, the threads.
  for (const auto &[knob, value] : candidate.config) {
    if (knob == "warps") {
      options.threads = 32 * value;
      continue;
    }
    if (llvm::Error e = setKnob(options, knob, std::to_string(value))) {
      candidate.status = Candidate::Status::CompileError;
      candidate.note = llvm::toString(std::move(e));
      return;
    }
  }
  mlir::PassManager pm(&context);
  buildPipeline(pm, Stage::NVVM, options);
  if (mlir::failed(pm.run(*module))) {
    candidate.status = Candidate::Status::Pruned;
    candidate.note = llvm::StringRef(src.diagnostics()).trim().str();
    size_t cut = candidate.note.find('\n');
    if (cut != std::string::npos)
      candidate.note.resize(cut);
    return;
  }
  llvm::Expected<std::string> ptx = serializeToPTX(*module, problem.chip);
  if (!ptx) {
    candidate.status = Candidate::Status::CompileError;
    candidate.note = llvm::toString(ptx.takeError());
    return;
  }
  // ptxas -v: registers, spills and shared memory of each kernel.
  auto report = ptxasReport(*ptx, problem.chip);
  if (!report) {
    llvm::consumeError(report.takeError());
    candidate.status = Candidate::Status::CompileError;
    candidate.note = "ptxas rejected the PTX";
    return;
  }
  if (!*report) {
    candidate.note = "compiled to PTX; ptxas not found, budgets not checked";
    return;
  }
  int registers = 0, spills = 0, shared = 0;
  for (const auto &[kernel, figures] : **report) {
    registers = std::max(registers, figures.registers);
    spills = std::max(spills, figures.spillBytes);
    shared = std::max(shared, figures.sharedBytes);
  }
  candidate.registers = registers;
  candidate.spillBytes = spills;
  candidate.sharedBytes = shared;
  int64_t threads = options.threads;
  if (spills > 0) {
    candidate.status = Candidate::Status::Pruned;
    candidate.note = llvm::formatv("spills {0} bytes", spills).str();
  } else if (registers * threads > 65536) {
    candidate.status = Candidate::Status::Pruned;
    candidate.note = llvm::formatv("{0} registers x {1} threads is over the "
                                   "65536 of an SM",
                                   registers, threads)
                         .str();
  } else {
    candidate.note = "compiled; fits the register and shared-memory budgets";
  }
}

} // namespace

//===----------------------------------------------------------------------===//
// The tune
//===----------------------------------------------------------------------===//

namespace {

/// Calls the progress callback, when there is one, on candidate `index`.
void reportCandidate(const TuneOptions &options, TuneResult &result, size_t index,
                     bool done) {
  if (options.progress)
    options.progress(result.candidates[index], index, result.candidates.size(), done);
}

/// The CUDA tune: every combination of the knobs, compiled and pruned by
/// ptxas's budgets (timing needs a GPU, and is not built yet).
llvm::Error tuneCuda(const TuneProblem &problem, const TuneOptions &options,
                     TuneResult &result) {
  if (problem.dtype != DType::F32)
    return fail("the CUDA kernels are f32 only");
  if (!options.compileOnly) {
    char error[512] = {0};
    if (!cellc_cuda_available(error, sizeof(error)))
      return fail(llvm::Twine(error) +
                  "; --compile-only compiles and prunes the CUDA candidates "
                  "without timing them");
    return fail("timing CUDA candidates is not built yet; --compile-only "
                "compiles and prunes them");
  }
  std::vector<Knob> knobs = knobsOf(TuneTarget::Cuda);
  KernelConfig base = defaultConfig(TuneTarget::Cuda, problem.batch);
  result.candidates.push_back({base});
  // Every combination, the first knob's values outermost.
  std::vector<size_t> at(knobs.size(), 0);
  for (bool more = !knobs.empty(); more;) {
    KernelConfig c;
    for (size_t k = 0; k < knobs.size(); ++k)
      c[knobs[k].name] = knobs[k].values[at[k]];
    if (c != base)
      result.candidates.push_back({c});
    more = false;
    for (size_t k = knobs.size(); k-- > 0 && !more;) {
      more = ++at[k] < knobs[k].values.size();
      if (!more)
        at[k] = 0;
    }
  }
  for (size_t i = 0; i < result.candidates.size(); ++i) {
    reportCandidate(options, result, i, false);
    compileCudaCandidate(problem, result.candidates[i]);
    if (i == 0 && result.candidates[0].status == Candidate::Status::CompileError)
      return fail(result.candidates[0].note);
    reportCandidate(options, result, i, true);
  }
  return llvm::Error::success();
}

/// Confirmation: the winner and the default again, alternating, so that a
/// win inside this machine's noise does not replace the default.
void confirmWinner(const TuneProblem &problem, const TuneOptions &options,
                   const Workload::Results &want, double perCandidate, TuneResult &result) {
  if (result.winner <= 0 || result.candidates[0].status != Candidate::Status::Ok)
    return;
  Candidate &w = result.candidates[result.winner];
  Candidate &d = result.candidates[0];
  double sums[2] = {0, 0};
  bool sound = true;
  for (int round = 0; round < 2 && sound; ++round)
    for (int k = 0; k < 2 && sound; ++k) {
      Candidate &c = k == 0 ? d : w;
      if (options.stage && k == 0 && round == 0)
        options.stage("rerunning the winner and the default, alternating");
      Report r = isolated(
          [&] {
            return runCandidate(problem, c.config, options.cacheDir, want, perCandidate, "");
          },
          std::max(120.0, 4 * options.budgetSeconds));
      sound = r.status == int(Candidate::Status::Ok);
      sums[k] += r.medianMs;
    }
  if (!sound) {
    w.note = "failed when rerun; the default wins";
    result.winner = 0;
    return;
  }
  double speedup = sums[0] / sums[1];
  result.confirmedSpeedup = speedup;
  w.note = llvm::formatv("confirmed {0:F2}x over the default, alternating", speedup).str();
  if (speedup < 1.03) {
    w.note = llvm::formatv("{0:F2}x over the default when rerun alternating: "
                           "inside the noise, so the default wins",
                           speedup)
                 .str();
    result.winner = 0;
  }
}

/// Stores the winner in the tuning cache under the problem's key.
llvm::Error storeWinner(const TuneProblem &problem, const TuneOptions &options,
                        TuneResult &result) {
  const Candidate &w = result.candidates[result.winner];
  llvm::json::Object entry;
  entry["config"] = jit::toJSON(w.config);
  entry["median_ms"] = w.medianMs;
  if (result.candidates[0].status == Candidate::Status::Ok)
    entry["default_ms"] = result.candidates[0].medianMs;
  entry["target"] = name(problem.target);
  entry["device"] = result.device;
  entry["batch_bucket"] = batchBucket(problem.batch);
  entry["compiler"] = compilerVersion();
  std::string text;
  llvm::raw_string_ostream os(text);
  os << llvm::json::Value(std::move(entry));
  KernelCache cache(tuningCacheDir(options.cacheDir));
  if (llvm::Error e = cache.store(result.key, os.str()))
    return e;
  result.stored = true;
  return llvm::Error::success();
}

} // namespace


llvm::Expected<TuneResult> cellc::tuner::tune(const TuneProblem &problem,
                                                const TuneOptions &options) {
  if (problem.batch < 1 || problem.steps < 1)
    return fail(llvm::formatv("the batch ({0}) and the sequence length ({1}) "
                              "must be at least 1",
                              problem.batch, problem.steps));
  Clock::time_point start = Clock::now();
  TuneResult result;
  result.device = deviceName(problem.target);
  result.key = tuningKey(problem.source, problem.sizes, problem.dtype,
                         problem.batch, problem.target, result.device);
  auto report = [&](size_t index, bool done) {
    reportCandidate(options, result, index, done);
  };

  if (problem.target == TuneTarget::Cuda) {
    if (llvm::Error e = tuneCuda(problem, options, result))
      return std::move(e);
    result.seconds = since(start);
    return result;
  }

  // CPU. The default config runs here, in process: it is the reference, and
  // a bad cell or size fails it with the front end's message.
  auto products = recurrentProducts(problem);
  if (!products)
    return products.takeError();
  KernelConfig base = defaultConfig(TuneTarget::Cpu, problem.batch);
  CpuOptions baseOptions;
  baseOptions.cacheDir = options.cacheDir;
  applyConfig(base, baseOptions);
  auto reference = compileCpu(problem.source, problem.fileName,
                                    problem.sizes, problem.dtype, baseOptions);
  if (!reference)
    return reference.takeError();
  Recompute mode;
  mode.kind = problem.saveGates ? Recompute::Kind::None : Recompute::Kind::Full;
  Workload work(**reference, problem.steps, problem.batch, /*seed=*/1);
  if (auto kept = work.run(**reference, mode, true); !kept)
    return kept.takeError();
  Workload::Results want = work.results();

  std::vector<KernelConfig> shapesToTry = cpuShapeCandidates(base);
  // Time per candidate: a share of the budget, within [0.2 s, 2 s].
  size_t expected = shapesToTry.size() + cpuValues("threads").size() *
                                             cpuValues("unit_slices").size();
  double perCandidate =
      std::clamp(options.budgetSeconds / double(2 * expected), 0.2, 2.0);
  auto runAll = [&](const std::vector<KernelConfig> &configs) {
    size_t first = result.candidates.size();
    for (const KernelConfig &c : configs)
      result.candidates.push_back({c});
    for (size_t i = first; i < result.candidates.size(); ++i) {
      Candidate &cand = result.candidates[i];
      std::string why = cpuPruneReason(cand.config, problem, *products);
      if (!why.empty()) {
        cand.status = Candidate::Status::Pruned;
        cand.note = why;
        continue;
      }
      if (i > 0 && since(start) > options.budgetSeconds) {
        cand.status = Candidate::Status::OverBudget;
        continue;
      }
      report(i, false);
      std::string broken = i > 0 ? injectedBreak(i) : "";
      Report r = isolated(
          [&] {
            return runCandidate(problem, cand.config, options.cacheDir, want,
                                perCandidate, broken);
          },
          std::max(120.0, 4 * options.budgetSeconds));
      cand.status = Candidate::Status(r.status);
      cand.note = r.note;
      cand.medianMs = r.medianMs;
      cand.repeats = r.repeats;
      cand.error = r.error;
      report(i, true);
    }
  };
  auto best = [&]() -> int {
    int winner = -1;
    for (auto [i, c] : llvm::enumerate(result.candidates))
      if (c.status == Candidate::Status::Ok &&
          (winner < 0 || c.medianMs < result.candidates[winner].medianMs))
        winner = i;
    return winner;
  };
  // Stage one: the kernels' shape at the default threads; stage two: the
  // threads for the fastest shape, and on more than one thread whether they
  // split a tile's units or its rows.
  runAll(shapesToTry);
  int shapeWinner = best();
  if (shapeWinner >= 0) {
    std::vector<KernelConfig> threads;
    KernelConfig winner = result.candidates[shapeWinner].config;
    for (int64_t t : cpuValues("threads"))
      for (int64_t slices : cpuValues("unit_slices")) {
        KernelConfig c = winner;
        c["threads"] = t;
        c["unit_slices"] = slices;
        if (c == winner || (t == 1 && slices == 0) ||
            std::find(threads.begin(), threads.end(), c) != threads.end())
          continue;
        threads.push_back(c);
      }
    runAll(threads);
  }
  result.winner = best();
  confirmWinner(problem, options, want, perCandidate, result);
  result.seconds = since(start);

  if (options.store && result.winner >= 0)
    if (llvm::Error e = storeWinner(problem, options, result))
      return std::move(e);
  return result;
}

std::string cellc::tuner::formatTable(const TuneResult &result) {
  std::string text;
  llvm::raw_string_ostream os(text);
  bool cuda = !result.candidates.empty() &&
              result.candidates[0].config.count("warps");
  double base = result.candidates.empty() ? 0 : result.candidates[0].medianMs;
  os << llvm::formatv("{0,4}  {1,-58} {2,-14} {3,10} {4,8}  {5}\n", "#", "config",
                      "status", cuda ? "regs/smem" : "median ms",
                      cuda ? "spills" : "speedup", "note");
  for (auto [i, c] : llvm::enumerate(result.candidates)) {
    std::string mark = int(i) == result.winner ? " *" : i == 0 ? " d" : "  ";
    std::string time, speed;
    if (cuda) {
      if (c.registers >= 0) {
        time = llvm::formatv("{0}/{1}K", c.registers, c.sharedBytes / 1024).str();
        speed = std::to_string(c.spillBytes);
      }
    } else if (c.status == Candidate::Status::Ok) {
      time = llvm::formatv("{0:F2}", c.medianMs).str();
      if (base > 0)
        speed = llvm::formatv("{0:F2}x", base / c.medianMs).str();
    }
    os << llvm::formatv("{0,4}{1} {2,-58} {3,-14} {4,10} {5,8}  {6}\n", i, mark,
                        str(c.config), nameOf(c.status), time, speed, c.note);
  }
  os << "(d: the default config; *: the winner)\n";
  return os.str();
}

llvm::json::Value cellc::tuner::toJSON(const TuneResult &result,
                                         const TuneProblem &problem) {
  llvm::json::Array candidates;
  for (const Candidate &c : result.candidates) {
    llvm::json::Object o;
    o["config"] = jit::toJSON(c.config);
    o["status"] = nameOf(c.status);
    o["note"] = c.note;
    if (c.status == Candidate::Status::Ok) {
      o["median_ms"] = c.medianMs;
      o["repeats"] = c.repeats;
      o["error"] = c.error;
    }
    if (c.registers >= 0) {
      o["registers"] = c.registers;
      o["spill_bytes"] = c.spillBytes;
      o["shared_bytes"] = c.sharedBytes;
    }
    candidates.push_back(std::move(o));
  }
  llvm::json::Object sizes;
  for (const auto &[name, value] : problem.sizes)
    sizes[name] = value;
  llvm::json::Object out;
  out["cell"] = problem.fileName;
  out["target"] = name(problem.target);
  out["device"] = result.device;
  out["dtype"] = problem.dtype == DType::F32 ? "f32" : "f64";
  out["sizes"] = std::move(sizes);
  out["batch"] = problem.batch;
  out["seq_len"] = problem.steps;
  out["save_gates"] = problem.saveGates;
  out["key"] = result.key;
  out["seconds"] = result.seconds;
  out["stored"] = result.stored;
  out["winner"] = result.winner;
  if (result.confirmedSpeedup > 0)
    out["confirmed_speedup"] = result.confirmedSpeedup;
  if (result.winner >= 0)
    out["winner_config"] = jit::toJSON(result.candidates[result.winner].config);
  out["candidates"] = std::move(candidates);
  return out;
}
