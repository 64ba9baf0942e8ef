//===- cellc-bench.cpp - Time a cell's forward and backward on the CPU ----===//
//
// Runs a cell through the CPU runtime on random data and prints, for each
// recompute mode, the median time of the forward alone, of forward plus
// backward, the bytes kept between them, and the most the runtime held.
// With --profile-phases, the batched kernels count the cycles each thread
// works and waits between barriers, and it prints them per step for one
// forward plus backward in each mode.
//
//===----------------------------------------------------------------------===//

#include "jit/CpuJit.h"
#include "compiler/Frontend/IRGen.h"
#include "tuner/Workload.h"
#include "tools/ToolOptions.h"
#include "runtime/cpu/HostBlas.h"

#include "llvm/Support/CommandLine.h"
#include "llvm/Support/FormatVariadic.h"
#include "llvm/Support/MemoryBuffer.h"
#include "llvm/Support/raw_ostream.h"

#include <algorithm>
#include <array>
#include <chrono>
#include <thread>
#if defined(__x86_64__) || defined(__i386__)
#include <x86intrin.h>
#endif

using namespace cellc;
using namespace cellc::tuner;
namespace cl = llvm::cl;

static cl::opt<std::string> cellFile(cl::cat(cellc::toolOptions()),
                                     cl::Positional, cl::desc("<cell file>"),
                                     cl::Required);
static cl::list<std::string> sizeArgs(cl::cat(cellc::toolOptions()), "D",
                                      cl::Prefix,
                                      cl::desc("Bind a size, as in -D H=256"),
                                      cl::value_desc("NAME=VALUE"));
static cl::opt<int64_t> batch(cl::cat(cellc::toolOptions()), "batch-size",
                              cl::desc("B"), cl::init(64));
static cl::opt<int64_t> steps(cl::cat(cellc::toolOptions()), "seq-len",
                              cl::desc("T"), cl::init(100));
static cl::opt<int> threads(cl::cat(cellc::toolOptions()), "cpu-threads",
                            cl::desc("threads (0: all cores)"), cl::init(0));
static cl::opt<int> repeats(cl::cat(cellc::toolOptions()), "repeats",
                            cl::desc("timed runs per figure"), cl::init(5));
static cl::list<std::string> modes(cl::cat(cellc::toolOptions()), "mode",
                                   cl::desc("recompute modes"),
                                   cl::CommaSeparated);
static cl::opt<bool> f64(cl::cat(cellc::toolOptions()), "f64",
                         cl::desc("double precision"), cl::init(false));
static cl::opt<std::string> kernels(cl::cat(cellc::toolOptions()), "kernels",
                                    cl::desc("auto, batched or per-row"),
                                    cl::init("auto"));
static cl::opt<int64_t>
    batchTile(cl::cat(cellc::toolOptions()), "batch-tile",
              cl::desc("batched kernels: rows per tile (0: default)"),
              cl::init(0));
static cl::opt<int64_t>
    vectorWidth(cl::cat(cellc::toolOptions()), "vector-width",
                cl::desc("batched kernels: lanes of the element code "
                         "(0: the host's widest)"),
                cl::init(0));
static cl::opt<int64_t>
    productRows(cl::cat(cellc::toolOptions()), "product-rows",
                cl::desc("batched kernels: rows of a product's register block (0: the "
                         "host's)"),
                cl::init(0));
static cl::opt<int64_t>
    productVectors(cl::cat(cellc::toolOptions()), "product-vectors",
                   cl::desc("batched kernels: output vectors per row of a product's "
                            "register block (0: the host's)"),
                   cl::init(0));
static cl::opt<int> unitSlices(
    cl::cat(cellc::toolOptions()), "unit-slices",
    cl::desc("batched kernels, with fewer tiles than threads: 1, the "
             "threads of a tile split its units; 0, its rows; -1 (the "
             "default), its rows from 4 a thread while their copies of the "
             "weights take at most 4 MiB"),
    cl::init(-1));
static cl::opt<bool> tuned(cl::cat(cellc::toolOptions()), "tuned",
                           cl::desc("use the tuned config for this batch when "
                                    "the tuning cache has one (cellc-tune)"),
                           cl::init(false));

static cl::opt<bool> profilePhases(
    cl::cat(cellc::toolOptions()), "profile-phases",
    cl::desc("batched kernels: print the time each thread works and waits "
             "between barriers, per step of one forward plus backward"),
    cl::init(false));

static cl::opt<bool> profileGemms(
    cl::cat(cellc::toolOptions()), "profile-gemms",
    cl::desc("print the whole-sequence GEMMs of one forward plus backward: "
             "each shape's calls, time and GFLOP/s, and the library"),
    cl::init(false));

/// Cycles of the counter the kernels read (`llvm.readcyclecounter`: the
/// TSC on x86) per microsecond, measured against the steady clock; 0 where
/// it is not known.
static double cyclesPerMicrosecond() {
#if defined(__x86_64__) || defined(__i386__)
  auto t0 = std::chrono::steady_clock::now();
  uint64_t c0 = __rdtsc();
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  uint64_t c1 = __rdtsc();
  auto t1 = std::chrono::steady_clock::now();
  return double(c1 - c0) / std::chrono::duration<double, std::micro>(t1 - t0).count();
#else
  return 0;
#endif
}

/// A table of the GEMMs of one forward plus backward, a row a shape
/// (op(A) transposed or not, op(B), M x N x K), with their total.
static void printGemms(llvm::raw_ostream &os,
                       const std::vector<cellc::runtime::host::GemmProfileRow> &rows) {
  os << "  GEMMs of one forward + backward:\n";
  os << llvm::formatv("  {0,-6} {1,22} {2,13} {3,6} {4,10} {5,9}\n", "op", "M x N x K",
                      "library", "calls", "ms", "GFLOP/s");
  double seconds = 0, flops = 0;
  for (const auto &row : rows) {
    double f = 2.0 * row.m * row.n * row.k * row.calls;
    os << llvm::formatv("  {0,-6} {1,22} {2,13} {3,6} {4,10:F2} {5,9:F1}\n",
                        std::string(row.transA ? "T" : "N") + (row.transB ? "T" : "N"),
                        llvm::formatv("{0} x {1} x {2}", row.m, row.n, row.k).str(),
                        row.library, row.calls, row.seconds * 1e3,
                        row.seconds > 0 ? f / row.seconds / 1e9 : 0);
    seconds += row.seconds;
    flops += f;
  }
  os << llvm::formatv("  {0,-6} {1,22} {2,13} {3,6} {4,10:F2} {5,9:F1}\n", "total", "", "",
                      "", seconds * 1e3, seconds > 0 ? flops / seconds / 1e9 : 0);
}

/// A table of what each thread of `profile` worked and waited before each
/// barrier, per step of `steps`, in us (or cycles where the clock's rate is
/// not known).
static void printProfile(llvm::raw_ostream &os, const char *kernel,
                         const driver::PhaseProfile &profile, int64_t steps,
                         double perMicrosecond) {
  if (profile.threads.empty())
    return;
  const char *unit = perMicrosecond > 0 ? "us" : "cycles";
  double scale = 1.0 / steps / (perMicrosecond > 0 ? perMicrosecond : 1);
  os << llvm::formatv("  {0} kernel, {1} launches: {2} per step, work / wait\n", kernel,
                      profile.launches, unit);
  os << llvm::formatv("  {0,-24}", "barrier after");
  for (const driver::PhaseProfile::Thread &t : profile.threads)
    os << llvm::formatv(" {0,17}", llvm::formatv("thread {0}.{1}", t.group, t.slice).str());
  os << "\n";
  std::vector<std::array<double, 2>> total(profile.threads.size(), {0, 0});
  for (size_t s = 0; s < profile.sites.size(); ++s) {
    os << llvm::formatv("  {0,-24}", profile.sites[s]);
    for (size_t i = 0; i < profile.threads.size(); ++i) {
      const auto &c = profile.threads[i].cycles[s];
      total[i][0] += c[0] * scale;
      total[i][1] += c[1] * scale;
      os << llvm::formatv(" {0,8:F2} /{1,7:F2}", c[0] * scale, c[1] * scale);
    }
    os << "\n";
  }
  os << llvm::formatv("  {0,-24}", "total");
  for (const auto &t : total)
    os << llvm::formatv(" {0,8:F2} /{1,7:F2}", t[0], t[1]);
  os << "\n";
}

static double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

int main(int argc, char **argv) {
  cellc::setToolVersionPrinter("cellc-bench");
  cellc::hideLibraryOptions();
  cl::ParseCommandLineOptions(argc, argv, "cellc-bench: time a cell on the CPU\n");
  auto file = llvm::MemoryBuffer::getFile(cellFile);
  if (!file) {
    llvm::errs() << "cellc-bench: cannot open " << cellFile << "\n";
    return 1;
  }
  SizeBindings sizes;
  for (const std::string &s : sizeArgs) {
    auto b = parseSizeBinding(s);
    if (!b) {
      llvm::errs() << "cellc-bench: " << llvm::toString(b.takeError()) << "\n";
      return 1;
    }
    sizes[b->first] = b->second;
  }
  llvm::errs() << cellWarnings((*file)->getBuffer(), cellFile, sizes);
  DType dtype = f64 ? DType::F64 : DType::F32;
  auto start = std::chrono::steady_clock::now();
  CpuOptions options;
  options.threads = threads;
  options.batchHint = batch;
  options.useTuned = tuned;
  options.batchTile = batchTile;
  options.unitSlices = unitSlices;
  options.vectorWidth = vectorWidth;
  options.productRows = productRows;
  options.productVectors = productVectors;
  options.profilePhases = profilePhases;
  if (kernels == "batched")
    options.kernels = CpuOptions::Kernels::Batched;
  else if (kernels == "per-row")
    options.kernels = CpuOptions::Kernels::PerRow;
  else if (kernels != "auto") {
    llvm::errs() << "cellc-bench: unknown kernels '" << kernels
                 << "'; expected auto, batched or per-row\n";
    return 1;
  }
  auto compiled = compileCpu((*file)->getBuffer(), cellFile, sizes, dtype,
                                   options);
  if (!compiled) {
    llvm::errs() << llvm::toString(compiled.takeError()) << "\n";
    return 1;
  }
  CpuCell &cell = **compiled;
  double compileSeconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  int64_t T = steps, B = batch;
  double perMicrosecond = profilePhases ? cyclesPerMicrosecond() : 0;
  Workload work(cell, T, B);

  std::vector<std::string> modeList(modes.begin(), modes.end());
  if (modeList.empty())
    modeList = {"none", "full", "chunk:16"};
  // The kernels' own tile: a step with no recurrent product runs one row
  // whatever the config's batch_tile.
  llvm::outs() << llvm::formatv(
      "cell {0}, {1}, T={2}, B={3}, {4} config {5} (kernel tile {6}), compiled in "
      "{7:F2} s\n",
      cellFile, f64 ? "f64" : "f32", T, B, cell.configSource(), cell.config(),
      cell.package().interface.forward.batchTile, compileSeconds);
  llvm::outs() << llvm::formatv("{0,-10} {1,12} {2,16} {3,14} {4,14}\n", "mode",
                                "forward ms", "fwd+bwd ms", "kept MiB",
                                "runtime peak");
  for (const std::string &m : modeList) {
    auto mode = parseRecompute(m);
    if (!mode) {
      llvm::errs() << llvm::toString(mode.takeError()) << "\n";
      return 1;
    }
    std::vector<double> fwd, both;
    int64_t kept = 0;
    for (int r = 0; r <= repeats; ++r) {
      auto t0 = std::chrono::steady_clock::now();
      if (auto e = work.run(cell, *mode, false); !e) {
        llvm::errs() << llvm::toString(e.takeError()) << "\n";
        return 1;
      }
      auto t1 = std::chrono::steady_clock::now();
      auto e = work.run(cell, *mode, true);
      if (!e) {
        llvm::errs() << llvm::toString(e.takeError()) << "\n";
        return 1;
      }
      auto t2 = std::chrono::steady_clock::now();
      kept = *e;
      if (r == 0)
        continue; // warm-up
      fwd.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
      both.push_back(std::chrono::duration<double, std::milli>(t2 - t1).count());
    }
    // The most the runtime's buffers held at once over forward and backward.
    driver::MemoryStats held = cell.memoryStats();
    llvm::outs() << llvm::formatv("{0,-10} {1,12:F2} {2,16:F2} {3,14:F2} {4,14:F2}\n", m,
                                  median(fwd), median(both), kept / (1024.0 * 1024.0),
                                  std::max(held.forwardPeak, held.backwardPeak) /
                                      (1024.0 * 1024.0));
    if (profileGemms) {
      cellc::runtime::host::setGemmProfile(true);
      if (auto e = work.run(cell, *mode, true); !e) {
        llvm::errs() << llvm::toString(e.takeError()) << "\n";
        return 1;
      }
      auto rows = cellc::runtime::host::gemmProfile();
      cellc::runtime::host::setGemmProfile(false);
      printGemms(llvm::outs(), rows);
    }
    if (profilePhases) {
      cell.resetPhaseProfile();
      if (auto e = work.run(cell, *mode, true); !e) {
        llvm::errs() << llvm::toString(e.takeError()) << "\n";
        return 1;
      }
      for (bool backward : {false, true})
        printProfile(llvm::outs(), backward ? "backward" : "forward",
                     cell.phaseProfile(backward), T, perMicrosecond);
    }
  }
  return 0;
}
