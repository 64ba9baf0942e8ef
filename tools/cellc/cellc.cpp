//===- cellc.cpp - The cellc compiler driver ------------------------------===//

#include "compiler/Frontend/IRGen.h"
#include "compiler/Frontend/Parser.h"
#include "compiler/Pipelines/Pipelines.h"
#include "tools/ToolOptions.h"
#include "dialects/Cell/IR/CellOps.h"
#include "dialects/Cell/Transforms/Passes.h"
#include "jit/CpuJit.h"
#include "jit/KernelCache.h"

#include "mlir/IR/AsmState.h"
#include "mlir/Pass/PassManager.h"
#include "mlir/IR/MLIRContext.h"
#include "mlir/IR/BuiltinOps.h"
#include "mlir/Support/FileUtilities.h"
#include "compiler/Conversion/Passes.h"
#include "compiler/Conversion/Common/PhasePlan.h"
#include "jit/ChunkPlan.h"
#include "llvm/Support/CommandLine.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/FormatVariadic.h"
#include "llvm/Support/JSON.h"
#include "llvm/Support/InitLLVM.h"
#include "llvm/Support/MemoryBuffer.h"
#include "llvm/Support/SourceMgr.h"
#include "llvm/Support/ToolOutputFile.h"
#include "llvm/Support/raw_ostream.h"

#include <deque>
#include <map>

using namespace cellc;
namespace cl = llvm::cl;

namespace {
/// The kernel knobs of Knobs.def, a flag each (--batch-tile, ...): its
/// integer, or its word as given ("": none named).
struct KnobFlags {
#define CELLC_INT_KNOB(Name, Member, Default, Uses, Help)                      \
  cl::opt<int64_t> Member{flagOf(#Name), cl::cat(cellc::toolOptions()),         \
                          cl::desc(Help), cl::init(Default)};
#define CELLC_WORD_KNOB(Name, Member, Enum, Default, Uses, Help)               \
  cl::opt<std::string> Member{flagOf(#Name), cl::cat(cellc::toolOptions()),     \
                              cl::desc(Help), cl::init("")};
#include "dialects/Cell/IR/Knobs.def"

  /// The flag of the knob `name`, kept for the options' lifetime.
  static llvm::StringRef flagOf(const char *name) {
    static std::deque<std::string> flags;
    return flags.emplace_back(findKnob(name)->flag());
  }
};

/// cellc's options, and the words among them parsed. They register with
/// LLVM's parser when constructed, in cellc_tool_cellc: at namespace scope they
/// would register when libcellc.so loads, beside cellc-tune's of the same
/// names (--arch, --target, -D, ...), and LLVM aborts on a name registered twice.
struct Flags {
  cl::opt<std::string> inputFilename{cl::cat(cellc::toolOptions()), cl::Positional,
                                     cl::desc("<cell file>"), cl::init("-"),
                                     cl::value_desc("filename")};

  cl::opt<std::string> outputFilename{cl::cat(cellc::toolOptions()), "o",
                                      cl::desc("Output file"),
                                      cl::value_desc("filename"), cl::init("-")};

  cl::list<std::string> sizeBindings{cl::cat(cellc::toolOptions()), "D", cl::Prefix,
                                     cl::desc("Bind a symbolic size, as in -D H=256"),
                                     cl::value_desc("NAME=VALUE")};

  // The stages come from KernelInterface.def (registered in cellc_tool_cellc).
  cl::opt<Emit> emitAction{cl::cat(cellc::toolOptions()), "emit",
                           cl::desc("The stage to print"), cl::init(Emit::Mlir)};

  cl::opt<std::string> targetName{
      cl::cat(cellc::toolOptions()), "target",
      cl::desc("cpu (the default) or cuda; --emit=nvvm, ptx and simt imply "
               "cuda"),
      cl::init("")};

  cl::opt<std::string> arch{cl::cat(cellc::toolOptions()), "arch",
                            cl::desc("CUDA architecture for --emit=ptx"),
                            cl::init("sm_90")};

  KnobFlags knobs;

  cl::opt<int> saveGatesFlag{
      cl::cat(cellc::toolOptions()), "save-gates",
      cl::desc("With --emit=kernels or llvm: specialize SAVE_GATES to 0 or 1 (by "
               "default the kernels keep the flag, and llvm takes 1)"),
      cl::init(-1)};

  cl::opt<bool> splitInputFile{
      cl::cat(cellc::toolOptions()), "split-input-file",
      cl::desc("Compile each part of the input between '# -----' lines on its "
               "own, keeping line numbers, as mlir-opt does for tests"),
      cl::init(false)};

  cl::opt<int64_t> planSteps{
      cl::cat(cellc::toolOptions()), "seq-len",
      cl::desc("With --emit=plan: the steps T of the training step whose memory the "
               "plan predicts (100)"),
      cl::init(100)};

  cl::opt<int64_t> planBatch{
      cl::cat(cellc::toolOptions()), "batch",
      cl::desc("With --emit=plan: the batch rows B of that training step (64)"),
      cl::init(64)};

  cl::opt<std::string> dtype{cl::cat(cellc::toolOptions()), "dtype",
                             cl::desc("Element type: f32, f64, f16, bf16"),
                             cl::init("f32")};

  cl::opt<std::string> chunkPart{
      cl::cat(cellc::toolOptions()), "chunk-part",
      cl::desc("Compile a part of the cell's chunkwise form instead of the cell, as a "
               "cell of its own: prologue (what the core reads, before it) or epilogue "
               "(the rest of the step after it); --emit=chunkwise shows the split"),
      cl::init("")};

  cl::opt<std::string> formFlag{
      cl::cat(cellc::toolOptions()), "form",
      cl::desc("With --emit=plan: the training form whose memory the plan predicts: "
               "step (the default), chunk (the chunkwise form of a cell whose matrix "
               "states are gated linear recurrences) or auto (the chunk form where "
               "form=\"auto\" would take it)"),
      cl::init("step")};

  cl::opt<int64_t> chunkLength{
      cl::cat(cellc::toolOptions()), "chunk",
      cl::desc("With --form=chunk: the chunk length (default: 64, or the power of "
               "two that holds a shorter sequence)"),
      cl::init(0)};

  cl::opt<bool> simtObjects{
      cl::cat(cellc::toolOptions()), "simt",
      cl::desc("With --emit=package --target=cuda: also the kernels compiled for the "
               "SIMT emulator, save.simt.so and replay.simt.so (Python's "
               "target=\"cuda-emu\" runs them)"),
      cl::init(false)};

  /// The command line's words, parsed once through KernelInterface.h.
  struct {
    std::optional<Target> target;
    std::optional<Strategy> strategy;
    Precision precision = Precision::Ieee;
    Storage storage = Storage::F32;
  } words;
};
} // namespace

/// Whether the kernels are built for CUDA: asked for, or implied by the stage.
static bool targetsCuda(const Flags &flags) {
  return flags.words.target == Target::Cuda || flags.emitAction == Emit::Nvvm ||
         flags.emitAction == Emit::Ptx || flags.emitAction == Emit::Simt ||
         (flags.emitAction == Emit::Package && flags.words.target != Target::Cpu);
}

/// Copies the integer knobs that `Use` (KnobCpu or KnobCuda) takes from the
/// command line into `options`: all of them, or with `namedOnly` those the
/// command line names. The words come parsed, in Flags::words.
template <unsigned Use, typename Options>
static void copyKnobs(Options &options, const KnobFlags &knobs, bool namedOnly = false) {
#define CELLC_INT_KNOB(Name, Member, Default, Uses, Help)                      \
  if constexpr (((Uses) & Use) != 0)                                           \
    if (!namedOnly || knobs.Member.getNumOccurrences())                        \
      options.Member = knobs.Member;
#include "dialects/Cell/IR/Knobs.def"
}

/// The options of the CPU kernels the command line asks for.
static PipelineOptions cpuOptions(const Flags &flags) {
  PipelineOptions options;
  options.strategy = flags.words.strategy.value_or(Strategy::Batched);
  copyKnobs<KnobCpu>(options, flags.knobs);
  return options;
}

/// The options of the CUDA kernels the command line asks for.
static PipelineOptions cudaOptions(const Flags &flags) {
  PipelineOptions options;
  options.strategy = flags.words.strategy.value_or(Strategy::BatchTiled);
  options.target = Target::Cuda;
  copyKnobs<KnobCuda>(options, flags.knobs);
  // Named: the persistent strategy's limit; none named: 0 lets the choice
  // take the architecture's opt-in (chooseCudaStrategy).
  if (!flags.knobs.sharedLimit.getNumOccurrences() && !flags.words.strategy)
    options.sharedLimit = 0;
  options.precision = flags.words.precision;
  options.storage = flags.words.storage;
  return options;
}

/// Prints what the cell declares and what its step computes.
static void printSummary(mlir::ModuleOp module, llvm::raw_ostream &os) {
  for (auto def : module.getOps<mlir::cell::DefOp>()) {
    os << "cell @" << def.getSymName() << "\n";
    auto printArgs = [&](llvm::StringRef what, mlir::ArrayAttr names,
                         mlir::Block::BlockArgListType args) {
      for (auto [name, arg] : llvm::zip(names.getAsValueRange<mlir::StringAttr>(), args))
        os << "  " << what << ' ' << name << ": " << arg.getType() << "\n";
    };
    printArgs("input", def.getInputNamesAttr(), def.getInputs());
    printArgs("state", def.getStateNamesAttr(), def.getStates());
    int64_t paramElements = 0, matvecFlops = 0;
    std::map<std::string, unsigned> opCounts;
    def.walk([&](mlir::Operation *op) {
      if (auto param = llvm::dyn_cast<mlir::cell::ParamOp>(op)) {
        auto type = llvm::cast<mlir::RankedTensorType>(param.getType());
        os << "  param " << param.getName() << ": " << type << "\n";
        paramElements += type.getNumElements();
      }
      if (auto matvec = llvm::dyn_cast<mlir::cell::MatvecOp>(op))
        matvecFlops += 2 * llvm::cast<mlir::RankedTensorType>(
                               matvec.getWeight().getType())
                               .getNumElements();
      if (op != def.getOperation())
        ++opCounts[op->getName().getStringRef().str()];
    });
    os << "  outputs:";
    for (llvm::StringRef name : def.getOutputNames().getAsValueRange<mlir::StringAttr>())
      os << ' ' << name;
    os << "\n  parameters: " << paramElements << " elements\n";
    os << "  matvec flops per sample and step: " << matvecFlops << "\n";
    os << "  ops:";
    for (auto &[name, count] : opCounts)
      os << ' ' << name << '=' << count;
    os << "\n";
  }
}

/// The CUDA options for `cell`: the command line's, with the strategy chosen
/// as Python chooses it when none is named.
static PipelineOptions chosenCudaOptions(mlir::ModuleOp cell, const Flags &flags) {
  PipelineOptions options = cudaOptions(flags);
  return flags.words.strategy ? options : chooseCudaStrategy(cell, options, flags.arch);
}

/// The CPU package's kernels as the JIT builds them for this host, with the
/// command line's knobs where it gives them.
static jit::CpuOptions cpuPackageOptions(const Flags &flags) {
  jit::CpuOptions options;
  options.kernels = flags.words.strategy == Strategy::PerRow
                        ? jit::CpuOptions::Kernels::PerRow
                        : jit::CpuOptions::Kernels::Batched;
  copyKnobs<KnobCpu>(options, flags.knobs, /*namedOnly=*/true);
  return options;
}

/// Writes the package to the -o directory: for CUDA, `kernels.json`,
/// `save.ptx` and `replay.ptx` (the kernels of both SAVE_GATES variants, and
/// what the runtime needs to call them without MLIR: arguments, tiles,
/// threads, workgroup bytes); for the CPU, `save.so` and `replay.so`
/// compiled for this host instead; with --simt, the CUDA package's kernels
/// for the SIMT emulator too.
static bool writePackage(mlir::ModuleOp cell, mlir::MLIRContext &context,
                         llvm::SourceMgr &sourceMgr, const Flags &flags) {
  mlir::SourceMgrDiagnosticHandler handler(sourceMgr, &context, llvm::errs());
  auto write = [&]() -> llvm::Error {
    if (targetsCuda(flags))
      return cellc::writePackage(cell, flags.outputFilename, chosenCudaOptions(cell, flags),
                                 flags.arch, flags.dtype, flags.simtObjects);
    jit::CpuOptions options = cpuPackageOptions(flags);
    auto package = buildCpuPackage(cell, jit::pipelineOptionsOf(options), flags.dtype,
                                   jit::kernelConfigText(options));
    if (!package)
      return package.takeError();
    return writeCpuPackage(*package, flags.outputFilename);
  };
  if (llvm::Error e = write()) {
    llvm::errs() << llvm::toString(std::move(e)) << "\n";
    return false;
  }
  return true;
}

/// Compiles one source buffer and prints the requested stage. Returns false
/// after reporting an error.
static bool processBuffer(std::unique_ptr<llvm::MemoryBuffer> buffer,
                          mlir::MLIRContext &context, const SizeBindings &sizes,
                          mlir::FloatType elementType, llvm::raw_ostream &os,
                          const Flags &flags) {
  llvm::SourceMgr sourceMgr;
  sourceMgr.AddNewSourceBuffer(std::move(buffer), llvm::SMLoc());
  CellDiagnostics diag(sourceMgr, llvm::errs());
  if (flags.emitAction == Emit::Ast) {
    llvm::StringRef text =
        sourceMgr.getMemoryBuffer(sourceMgr.getMainFileID())->getBuffer();
    Parser parser(text, diag);
    std::unique_ptr<CellAST> cell = parser.parseCell();
    if (!cell)
      return false;
    cell->dump(os);
    return true;
  }
  mlir::OwningOpRef<mlir::ModuleOp> module =
      compileCellSource(context, sizes, elementType, diag);
  if (!module)
    return false;
  if (!flags.chunkPart.empty()) {
    mlir::SourceMgrDiagnosticHandler handler(sourceMgr, &context, llvm::errs());
    if (llvm::Error e = takeChunkPart(*module, flags.chunkPart)) {
      llvm::consumeError(std::move(e));
      return false;
    }
  }
  if (flags.emitAction == Emit::Summary) {
    printSummary(*module, os);
    return true;
  }
  if (flags.emitAction == Emit::Package)
    return writePackage(*module, context, sourceMgr, flags);
  if (flags.emitAction == Emit::Plan && flags.formFlag != "step") {
    mlir::SourceMgrDiagnosticHandler handler(sourceMgr, &context, llvm::errs());
    std::string why;
    bool chunk = flags.formFlag == "chunk" ||
                 jit::chunkFormExpected(*module, flags.planSteps, flags.chunkLength,
                                        why);
    if (flags.formFlag == "auto")
      os << "form=auto takes the " << (chunk ? "chunk" : "step") << " form: " << why
         << "\n";
    if (chunk) {
      if (llvm::Error e = jit::printChunkMemoryPlan(
              *module, flags.planSteps, flags.planBatch, flags.chunkLength, os)) {
        llvm::errs() << "cellc: error: " << llvm::toString(std::move(e)) << "\n";
        return false;
      }
      return true;
    }
  }
  PipelineOptions options =
      targetsCuda(flags) ? chosenCudaOptions(*module, flags) : cpuOptions(flags);
  if (flags.saveGatesFlag >= 0)
    options.saveGates = flags.saveGatesFlag != 0;
  options.planSteps = flags.planSteps;
  options.planBatch = flags.planBatch;
  mlir::SourceMgrDiagnosticHandler handler(sourceMgr, &context, llvm::errs());
  if (llvm::Error e =
          jit::printStage(*module, flags.emitAction, options, flags.arch, os)) {
    // Pass failures were reported through the handler already.
    std::string message = llvm::toString(std::move(e));
    if (message != "the passes failed")
      llvm::errs() << (llvm::StringRef(message).starts_with("cellc:") ? "" : "cellc: error: ")
                   << message << "\n";
    return false;
  }
  return true;
}

/// `cellc cache list|clear [--dir DIR]`: the compiled-kernel cache.
static int cacheCommand(int argc, char **argv) {
  std::string action = argc > 2 ? argv[2] : "";
  std::string dir;
  if (argc > 4 && llvm::StringRef(argv[3]) == "--dir")
    dir = argv[4];
  jit::KernelCache cache(dir);
  if (action == "list") {
    uint64_t total = 0;
    auto entries = cache.list();
    for (const auto &e : entries) {
      llvm::outs() << e.key << "  " << e.bytes << " bytes"
                   << (e.sound ? "" : "  (corrupt: will be recompiled)") << "\n";
      total += e.bytes;
    }
    llvm::outs() << entries.size() << (entries.size() == 1 ? " entry, " : " entries, ")
                 << total << " bytes in "
                 << cache.directory() << "\n";
    return 0;
  }
  if (action == "clear") {
    auto removed = cache.removeAll();
    if (!removed) {
      llvm::errs() << "cellc: error: " << llvm::toString(removed.takeError())
                   << "\n";
      return 1;
    }
    llvm::outs() << "removed " << *removed << (*removed == 1 ? " entry" : " entries")
                 << " from "
                 << cache.directory() << "\n";
    return 0;
  }
  llvm::errs() << "cellc: error: expected 'cellc cache list' or 'cellc cache "
                  "clear' [--dir DIR]\n";
  return 1;
}

/// cellc's main, a C function so that libcellc.so can export it;
/// tools/ToolMain.cpp makes it the executable. As a main does, it exits on
/// --help, --version and a bad option, and shuts LLVM down when it returns
/// (InitLLVM's destructor).
extern "C" int cellc_tool_cellc(int argc, char **argv) {
  llvm::InitLLVM init(argc, argv);
  if (argc > 1 && llvm::StringRef(argv[1]) == "cache")
    return cacheCommand(argc, argv);
  Flags flags;
  mlir::registerAsmPrinterCLOptions();
  mlir::registerMLIRContextCLOptions();
  cellc::setToolVersionPrinter("cellc");
  cellc::hideLibraryOptions();
  for (const Word &w : Words<Emit>())
    flags.emitAction.getParser().addLiteralOption(w.name, *parse<Emit>(w.name), w.help);
  cl::ParseCommandLineOptions(argc, argv, "cellc: a compiler for recurrent cells\n");

  auto fileOrErr = llvm::MemoryBuffer::getFileOrSTDIN(flags.inputFilename);
  if (std::error_code ec = fileOrErr.getError()) {
    llvm::errs() << "cellc: error: cannot open '" << flags.inputFilename
                 << "': " << ec.message() << "\n";
    return 1;
  }
  SizeBindings sizes;
  for (const std::string &text : flags.sizeBindings) {
    auto binding = parseSizeBinding(text);
    if (!binding) {
      llvm::errs() << "cellc: error: " << llvm::toString(binding.takeError())
                   << "\n";
      return 1;
    }
    sizes[binding->first] = binding->second;
  }

  std::string errorMessage;
  auto output = mlir::openOutputFile(
      flags.emitAction == Emit::Package ? std::string("-")
                                        : std::string(flags.outputFilename),
      &errorMessage);
  if (!output) {
    llvm::errs() << "cellc: error: " << errorMessage << "\n";
    return 1;
  }
  mlir::MLIRContext context;
  mlir::FloatType elementType = parseElementType(context, flags.dtype);
  if (!elementType) {
    llvm::errs() << "cellc: error: unknown dtype '" << flags.dtype
                 << "'; expected f32, f64, f16 or bf16\n";
    return 1;
  }
  // The words of the command line, each through its one parse function.
  auto parseWord = [](auto &into, const std::string &text, const char *option,
                      auto expected) {
    if (text.empty())
      return true;
    using E = typename std::remove_reference_t<decltype(into)>::value_type;
    if (std::optional<E> value = parse<E>(text)) {
      into = *value;
      return true;
    }
    llvm::errs() << "cellc: error: unknown " << option << " '" << text
                 << "'; expected " << expected << "\n";
    return false;
  };
  if (!parseWord(flags.words.target, flags.targetName, "target",
                 Words<Target>::expected()) ||
      !parseWord(flags.words.strategy, flags.knobs.strategy, "strategy",
                 "batched or per-row (CPU), batch-tiled or persistent (CUDA)"))
    return 1;
  std::optional<Precision> precisionWord;
  std::optional<Storage> storageWord;
  if (!parseWord(precisionWord, flags.knobs.precision, "precision",
                 Words<Precision>::expected()) ||
      !parseWord(storageWord, flags.knobs.storage, "storage",
                 Words<Storage>::expected()))
    return 1;
  flags.words.precision = precisionWord.value_or(Precision::Ieee);
  flags.words.storage = storageWord.value_or(Storage::F32);
  bool cuda = targetsCuda(flags);
  if (flags.planSteps < 1 || flags.planBatch < 1) {
    llvm::errs() << "cellc: error: --seq-len and --batch must be at least 1\n";
    return 1;
  }
  if (flags.formFlag != "step" && flags.formFlag != "chunk" && flags.formFlag != "auto") {
    llvm::errs() << "cellc: error: unknown --form '" << flags.formFlag
                 << "'; expected step, chunk or auto\n";
    return 1;
  }
  if ((flags.formFlag != "step" || flags.chunkLength != 0) &&
      flags.emitAction != Emit::Plan) {
    llvm::errs() << "cellc: error: --form and --chunk apply to --emit=plan (the chunk "
                    "form runs from Python, form=\"chunk\"; --chunk-part compiles its "
                    "parts)\n";
    return 1;
  }
  if (flags.chunkLength < 0) {
    llvm::errs() << "cellc: error: --chunk must be a positive number of steps\n";
    return 1;
  }
  if (flags.chunkLength != 0 && flags.formFlag == "step") {
    llvm::errs() << "cellc: error: --chunk is the chunk form's: it takes --form=chunk or "
                    "--form=auto\n";
    return 1;
  }
  if (flags.formFlag != "step" && (!flags.chunkPart.empty() || targetsCuda(flags))) {
    llvm::errs() << "cellc: error: --form plans the chunk form on the CPU: not with "
                 << (flags.chunkPart.empty()
                         ? "--target=cuda (its core runs in torch there)"
                         : "--chunk-part (a part is a cell of the step form)")
                 << "\n";
    return 1;
  }
  if (flags.emitAction == Emit::Package &&
      (flags.outputFilename == "-" || flags.splitInputFile)) {
    llvm::errs() << "cellc: error: --emit=package writes a directory: give it "
                    "with -o DIR\n";
    return 1;
  }
  if (flags.words.strategy && isCudaStrategy(*flags.words.strategy) && !cuda) {
    llvm::errs() << "cellc: error: --strategy=" << flags.knobs.strategy
                 << " is a CUDA strategy; it needs --target=cuda\n";
    return 1;
  }
  if (flags.words.strategy && !isCudaStrategy(*flags.words.strategy) && cuda) {
    llvm::errs() << "cellc: error: --strategy=" << flags.knobs.strategy
                 << " is a CPU strategy; the CUDA ones are batch-tiled and "
                    "persistent\n";
    return 1;
  }
  if (flags.knobs.sharedLimit.getNumOccurrences() && flags.words.strategy &&
      flags.words.strategy != Strategy::Persistent) {
    llvm::errs() << "cellc: error: --shared-limit sizes the persistent "
                    "strategy's dynamic shared memory; the batch-tiled kernels "
                    "use 48 KiB of static shared memory\n";
    return 1;
  }
  if (flags.words.storage != Storage::F32 && !cuda) {
    llvm::errs() << "cellc: error: --storage=" << flags.knobs.storage
                 << " is for the CUDA kernels; it needs --target=cuda\n";
    return 1;
  }
  if (flags.words.precision != Precision::Ieee && !cuda) {
    llvm::errs() << "cellc: error: --precision=" << flags.knobs.precision
                 << " runs the matvecs on tensor cores; it needs --target=cuda\n";
    return 1;
  }
  if (flags.words.target == Target::Cpu && cuda) {
    llvm::errs() << "cellc: error: --emit=nvvm and ptx are for --target=cuda\n";
    return 1;
  }
  if (cuda && flags.emitAction == Emit::Llvm) {
    llvm::errs() << "cellc: error: --emit=llvm is the CPU's lowering; use "
                    "--emit=nvvm or --emit=ptx with --target=cuda\n";
    return 1;
  }
  if (flags.emitAction == Emit::Package && !cuda && flags.dtype != "f32" &&
      flags.dtype != "f64") {
    llvm::errs() << "cellc: error: the CPU runs f32 and f64 cells, not " << flags.dtype
                 << "\n";
    return 1;
  }
  if (cuda && flags.dtype != "f32") {
    llvm::errs() << "cellc: error: --target=cuda compiles f32 cells for now, "
                    "not " << flags.dtype << "\n";
    return 1;
  }

  std::unique_ptr<llvm::MemoryBuffer> input = std::move(*fileOrErr);
  if (!flags.splitInputFile) {
    bool ok = processBuffer(std::move(input), context, sizes, elementType,
                            output->os(), flags);
    output->keep();
    return ok ? 0 : 1;
  }

  // Each part keeps its line numbers: the text before it becomes blank lines.
  llvm::StringRef text = input->getBuffer();
  llvm::SmallVector<llvm::StringRef> parts;
  llvm::StringRef rest = text;
  while (true) {
    size_t sep = rest.find("\n# -----");
    if (sep == llvm::StringRef::npos) {
      parts.push_back(rest);
      break;
    }
    parts.push_back(rest.take_front(sep + 1));
    rest = rest.drop_front(sep + 1);
    rest = rest.drop_until([](char c) { return c == '\n'; });
  }
  bool ok = true;
  for (auto [i, part] : llvm::enumerate(parts)) {
    size_t offset = part.data() - text.data();
    std::string padded(text.take_front(offset).count('\n'), '\n');
    padded += part.str();
    if (i != 0)
      output->os() << "// -----\n";
    ok &= processBuffer(llvm::MemoryBuffer::getMemBufferCopy(
                            padded, input->getBufferIdentifier()),
                        context, sizes, elementType, output->os(), flags);
  }
  output->keep();
  return ok ? 0 : 1;
}
