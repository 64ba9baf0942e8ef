//===- cellc-tune.cpp - Autotune a cell's kernel config ---------------------===//
//
// Times the candidate kernel configs of a cell at a problem size, checks
// each against the default config, prints a table and writes the winner to
// the tuning cache, where the JIT finds it.
//
// Exit codes: 0 tuned (or compiled, with --compile-only); 1 bad input (the
// cell, a size, an option); 3 the target is not there (no GPU); 4 no
// candidate ran correctly.
//
//===----------------------------------------------------------------------===//

#include "compiler/Frontend/IRGen.h"
#include "tuner/Tuner.h"
#include "tools/ToolOptions.h"
#include "jit/KernelCache.h"

#include "llvm/Support/CommandLine.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/FormatVariadic.h"
#include "llvm/Support/InitLLVM.h"
#include "llvm/Support/MemoryBuffer.h"
#include "llvm/Support/raw_ostream.h"

using namespace cellc;
using namespace cellc::tuner;
namespace cl = llvm::cl;

namespace {
/// cellc-tune's options. They register with LLVM's parser when constructed,
/// in cellc_tool_tune: at namespace scope they would register when libcellc.so
/// loads, beside cellc's of the same names (--arch, --target, -D, ...), and
/// LLVM aborts on a name registered twice.
struct Flags {
  cl::opt<std::string> cellFile{cl::cat(cellc::toolOptions()), cl::Positional,
                                cl::desc("<cell file, or - for stdin>")};
  cl::opt<std::string> sourceName{
      cl::cat(cellc::toolOptions()), "source-name",
      cl::desc("The name that messages give the cell (default: the file's)"),
      cl::value_desc("name")};
  cl::opt<std::string> chip{cl::cat(cellc::toolOptions()), "arch",
                            cl::desc("CUDA: the chip the PTX is for and "
                                     "ptxas checks against"),
                            cl::init("sm_90")};
  cl::list<std::string> sizeArgs{cl::cat(cellc::toolOptions()), "D", cl::Prefix,
                                 cl::desc("Bind a size, as in -D H=256"),
                                 cl::value_desc("NAME=VALUE")};
  cl::opt<int64_t> batch{cl::cat(cellc::toolOptions()), "batch",
                         cl::desc("Batch size B (tunes are "
                                  "shared by the B of one power-of-two bucket)"),
                         cl::init(64)};
  cl::opt<int64_t> seqLen{cl::cat(cellc::toolOptions()), "seq-len",
                          cl::desc("Sequence length T"), cl::init(100)};
  cl::opt<std::string> target{cl::cat(cellc::toolOptions()), "target",
                              cl::desc("cpu or cuda"), cl::init("cpu")};
  cl::opt<std::string> dtype{cl::cat(cellc::toolOptions()), "dtype",
                             cl::desc("f32 or f64"), cl::init("f32")};
  cl::opt<int> saveGates{cl::cat(cellc::toolOptions()), "save-gates",
                         cl::desc("Time the training step with SAVE_GATES=1 "
                                  "(recompute none) or 0 (full)"),
                         cl::init(1)};
  cl::opt<std::string> budget{cl::cat(cellc::toolOptions()), "budget",
                              cl::desc("Time for the whole tune: 60s, 2m, 90"),
                              cl::init("60s")};
  cl::opt<std::string> jsonFile{cl::cat(cellc::toolOptions()), "json",
                                cl::desc("Write the results as JSON"),
                                cl::value_desc("file")};
  cl::opt<bool> compileOnly{
      cl::cat(cellc::toolOptions()), "compile-only",
      cl::desc("Compile and prune the candidates without timing them (CUDA "
               "without a GPU)"),
      cl::init(false)};
  cl::opt<bool> noStore{cl::cat(cellc::toolOptions()), "no-store",
                        cl::desc("Do not write the winner to the tuning cache"),
                        cl::init(false)};
  cl::opt<std::string> form{
      cl::cat(cellc::toolOptions()), "form",
      cl::desc("step: the step kernels' knobs; chunk: the chunk form's length, "
               "which Python runs (python3 -m cellc cellc-tune --form=chunk)"),
      cl::init("step")};
  cl::opt<bool> listKnobs{cl::cat(cellc::toolOptions()), "list-knobs",
                          cl::desc("Print the target's knobs and their values"),
                          cl::init(false)};
};
} // namespace

static int usage(const llvm::Twine &message) {
  llvm::errs() << "cellc-tune: error: " << message << "\n";
  return 1;
}

/// "60s", "2m", "1.5m" or "90" (seconds).
static std::optional<double> parseSeconds(llvm::StringRef text) {
  double scale = 1;
  if (text.consume_back("s"))
    scale = 1;
  else if (text.consume_back("m"))
    scale = 60;
  double v;
  if (text.getAsDouble(v) || v <= 0)
    return std::nullopt;
  return v * scale;
}

/// cellc-tune's main, a C function so that libcellc.so can export it;
/// tools/ToolMain.cpp makes it the executable. As a main does, it exits on
/// --help, --version and a bad option, and shuts LLVM down when it returns
/// (InitLLVM's destructor).
extern "C" int cellc_tool_tune(int argc, char **argv) {
  llvm::InitLLVM init(argc, argv);
  Flags flags;
  cellc::setToolVersionPrinter("cellc-tune");
  cellc::hideLibraryOptions();
  cl::ParseCommandLineOptions(argc, argv,
                              "cellc-tune: autotune the kernel config of a cell\n");
  if (flags.form == "chunk")
    return usage("the chunk form runs in Python, which tunes its length: python3 -m cellc "
                 "cellc-tune --form=chunk CELL -D NAME=N... --batch B --seq-len T, or "
                 "cellc.autotune(cell, sizes, batch=B, seq_len=T, form=\"chunk\")");
  if (flags.form != "step")
    return usage("--form must be step or chunk, not '" + flags.form + "'");
  auto parsedTarget = parseTuneTarget(flags.target);
  if (!parsedTarget)
    return usage(llvm::toString(parsedTarget.takeError()));
  if (flags.listKnobs) {
    for (const Knob &k : knobsOf(*parsedTarget)) {
      std::string values;
      for (int64_t v : k.values)
        values += (values.empty() ? "" : " ") + std::to_string(v);
      llvm::outs() << llvm::formatv("{0,-16} {1,-18} {2}\n", k.name, values, k.help);
    }
    return 0;
  }
  if (flags.cellFile.empty())
    return usage("no cell file given");
  TuneProblem problem;
  problem.target = *parsedTarget;
  auto file = llvm::MemoryBuffer::getFileOrSTDIN(flags.cellFile);
  if (!file)
    return usage("cannot read " + flags.cellFile + ": " + file.getError().message());
  problem.source = (*file)->getBuffer().str();
  problem.fileName = flags.sourceName.empty() ? flags.cellFile : flags.sourceName;
  problem.chip = flags.chip;
  for (const std::string &s : flags.sizeArgs) {
    auto b = parseSizeBinding(s);
    if (!b)
      return usage(llvm::toString(b.takeError()));
    problem.sizes[b->first] = b->second;
  }
  llvm::errs() << cellWarnings(problem.source, problem.fileName, problem.sizes);
  if (flags.dtype == "f32")
    problem.dtype = DType::F32;
  else if (flags.dtype == "f64")
    problem.dtype = DType::F64;
  else if (flags.dtype == "bf16")
    return usage("--dtype=bf16 is not supported yet: the kernels run f32 (and "
                 "f64 on the CPU)");
  else
    return usage("unknown --dtype '" + flags.dtype + "'; expected f32 or f64");
  if (flags.saveGates != 0 && flags.saveGates != 1)
    return usage("--save-gates takes 0 or 1");
  problem.saveGates = flags.saveGates == 1;
  if (flags.batch < 1)
    return usage(
        llvm::formatv("--batch must be at least 1, not {0}", int64_t(flags.batch)));
  if (flags.seqLen < 1)
    return usage(
        llvm::formatv("--seq-len must be at least 1, not {0}", int64_t(flags.seqLen)));
  problem.batch = flags.batch;
  problem.steps = flags.seqLen;

  TuneOptions options;
  std::optional<double> seconds = parseSeconds(flags.budget);
  if (!seconds)
    return usage("--budget takes a positive time such as 60s, 2m or 90, not '" +
                 flags.budget + "'");
  options.budgetSeconds = *seconds;
  options.compileOnly = flags.compileOnly;
  options.store = !flags.noStore && !flags.compileOnly;
  options.progress = [](const Candidate &c, size_t i, size_t n, bool done) {
    if (!done) {
      llvm::errs() << llvm::formatv("[{0}/{1}] {2} ...", i + 1, n, str(c.config));
      llvm::errs().flush();
      return;
    }
    llvm::errs() << " " << nameOf(c.status);
    if (c.status == Candidate::Status::Ok)
      llvm::errs() << llvm::formatv(" {0:F2} ms", c.medianMs);
    llvm::errs() << "\n";
  };

  options.stage = [](llvm::StringRef what) { llvm::errs() << what << "\n"; };

  llvm::outs() << llvm::formatv("cellc-tune: {0} on {1}, {2}, B={3} (bucket {4}), "
                                "T={5}, SAVE_GATES={6}, budget {7:F0} s\n",
                                problem.fileName, name(problem.target), flags.dtype,
                                flags.batch, batchBucket(flags.batch), flags.seqLen,
                                int(flags.saveGates),
                                options.budgetSeconds);
  llvm::outs().flush();
  auto result = tune(problem, options);
  if (!result) {
    std::string message = llvm::toString(result.takeError());
    // The front end's messages already say file:line:col: error.
    if (llvm::StringRef(message).contains(": error: "))
      llvm::errs() << message << (llvm::StringRef(message).ends_with("\n") ? "" : "\n");
    else
      llvm::errs() << "cellc-tune: error: " << message << "\n";
    return llvm::StringRef(message).contains("no CUDA driver/GPU") ? 3 : 1;
  }
  llvm::outs() << formatTable(*result);
  if (!flags.jsonFile.empty()) {
    std::error_code ec;
    llvm::raw_fd_ostream os(flags.jsonFile, ec);
    if (ec)
      return usage("cannot write " + flags.jsonFile + ": " + ec.message());
    os << llvm::formatv("{0:2}", toJSON(*result, problem)) << "\n";
  }
  if (flags.compileOnly) {
    size_t fit = 0;
    for (const Candidate &c : result->candidates)
      fit += c.status == Candidate::Status::Untried;
    llvm::outs() << llvm::formatv("{0} of {1} candidates compiled within the "
                                  "budgets, in {2:F1} s; not timed (--compile-only)\n",
                                  fit, result->candidates.size(), result->seconds);
    return 0;
  }
  if (result->winner < 0) {
    llvm::errs() << "cellc-tune: error: no candidate ran correctly\n";
    return 4;
  }
  const Candidate &w = result->candidates[result->winner];
  const Candidate &d = result->candidates[0];
  llvm::outs() << llvm::formatv("winner: {0}{1}: {2:F2} ms", str(w.config),
                                result->winner == 0 ? " (the default)" : "", w.medianMs);
  if (result->confirmedSpeedup > 0)
    llvm::outs() << llvm::formatv(", {0:F2}x the default when rerun alternating with it",
                                  result->confirmedSpeedup);
  else if (d.status == Candidate::Status::Ok && result->winner != 0)
    llvm::outs() << llvm::formatv(", {0:F2}x the default ({1:F2} ms)",
                                  d.medianMs / w.medianMs, d.medianMs);
  llvm::outs() << llvm::formatv("; tuned in {0:F1} s\n", result->seconds);
  if (result->stored)
    llvm::outs() << "stored in " << tuningCacheDir() << " under key " << result->key
                 << "\n";
  return 0;
}
