//===- CellcModule.cpp - The _cellc Python extension ----------------------===//
//
// A thin pybind11 layer over the front end, the pipelines and the JIT: it
// checks cells, prints their IR, and builds packages (CPU packages through
// the JIT's cache, CUDA packages for cellc.cuda). The CPU runtime that runs
// them is the _cellc_runtime extension, which links no MLIR.
//
//===----------------------------------------------------------------------===//

#include "compiler/Frontend/IRGen.h"
#include "compiler/Frontend/Parser.h"
#include "compiler/Pipelines/Pipelines.h"
#include "dialects/Cell/Transforms/LinearRecurrence.h"
#include "dialects/Cell/Transforms/Passes.h"

#include "mlir/IR/Diagnostics.h"
#include "mlir/IR/MLIRContext.h"
#include "mlir/Pass/PassManager.h"
#include "jit/ChunkPlan.h"
#include "python/src/PlanDict.h"
#include "jit/CpuJit.h"
#include "jit/KernelCache.h"
#include "jit/TuningCache.h"

#include "llvm/Support/MemoryBuffer.h"
#include "llvm/Support/SourceMgr.h"

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <optional>

namespace py = pybind11;
using namespace cellc;
using namespace cellc::jit;

namespace {

/// A bad cell, with the front end's `file:line:col` message (a ValueError),
/// and one that is wrong only at the sizes it was compiled at (a chunk that
/// does not divide): both registered in the module.
struct CellError : std::runtime_error {
  using std::runtime_error::runtime_error;
};
struct SizeError : CellError {
  using CellError::CellError;
};

/// Exports the words of `E` as a Python enum whose members are named as
/// the words are (`Target.cuda`, `getattr(Strategy, "batch-tiled")`).
template <typename E> void exportWords(py::module_ &m, const char *name) {
  py::enum_<E> words(m, name);
  for (const Word &w : Words<E>())
    words.value(w.name, *parse<E>(w.name), w.help);
}

/// Raises `error` as Python sees it: a bad cell as CellError or SizeError,
/// anything else as ValueError.
[[noreturn]] void raiseError(llvm::Error error) {
  std::string message;
  bool cell = false, sizeOnly = false;
  llvm::handleAllErrors(
      std::move(error),
      [&](const CellSourceError &e) {
        cell = true;
        sizeOnly = e.sizeOnly;
        message = e.message;
      },
      [&](const llvm::ErrorInfoBase &e) { message = e.message(); });
  if (sizeOnly)
    throw SizeError(message);
  if (cell)
    throw CellError(message);
  throw py::value_error(message);
}

/// Raises what the front end reported about `src`.
[[noreturn]] void raiseCell(CellSource &src) { raiseError(src.takeError()); }

/// The declarations of a cell: (kind, name, shape), each size a list of
/// (coefficient, [size names]) terms. Raises ValueError with the front end's
/// file:line:col message on a bad cell.
py::list declarations(const std::string &source, const std::string &fileName) {
  CellSource src(source, fileName);
  Parser parser(src.text(), src.diag);
  auto cell = parser.parseCell();
  if (!cell)
    raiseCell(src);
  py::list result;
  for (const Decl &decl : cell->decls) {
    py::list shape;
    for (const SizeExpr &size : decl.shape) {
      py::list terms;
      for (const auto &term : size.terms) {
        py::list names;
        for (const Ident &sym : term.symbols)
          names.append(sym.name);
        terms.append(py::make_tuple(term.coefficient, names));
      }
      shape.append(terms);
    }
    result.append(py::make_tuple(spell(decl.kind).str(), decl.ident.name, shape));
  }
  return result;
}

/// The cell IR of `src` at `sizes` in `dtype`; a bad dtype raises TypeError,
/// a bad cell the front end's error.
mlir::OwningOpRef<mlir::ModuleOp> compiled(CellSource &src, mlir::MLIRContext &context,
                                           const std::map<std::string, int64_t> &sizes,
                                           const std::string &dtype) {
  mlir::FloatType element = parseElementType(context, dtype);
  if (!element)
    throw py::type_error("unknown dtype " + dtype);
  SizeBindings bindings(sizes.begin(), sizes.end());
  auto module = compileCellSource(context, bindings, element, src.diag);
  if (!module)
    raiseCell(src);
  return module;
}

/// Builds the cell IR at `sizes` and prints `stage` ("mlir", "split", "grad",
/// "saves", "plan", "kernels", "llvm"). Warnings come back with the text;
/// errors raise ValueError.
std::pair<std::string, std::string>
emit(const std::string &source, const std::string &fileName,
     const std::map<std::string, int64_t> &sizes, const std::string &dtype,
     const std::string &stage, int saveGates) {
  CellSource src(source, fileName);
  llvm::raw_string_ostream &os = src.os;
  mlir::MLIRContext context;
  auto module = compiled(src, context, sizes, dtype);
  // The stage through its one parse function; the IR stages print as
  // `cellc --emit` prints them (printStage).
  std::optional<Emit> parsed = parse<Emit>(stage);
  if (!parsed || *parsed == Emit::Ast || *parsed == Emit::Summary ||
      *parsed == Emit::Ptx || *parsed == Emit::Package || *parsed == Emit::Nvvm ||
      *parsed == Emit::Simt)
    throw py::value_error("unknown stage '" + stage +
                          "'; expected mlir, split, chunkwise, grad, saves, plan, "
                          "phases, kernels or llvm (ptx: Cell.emit builds the package)");
  mlir::SourceMgrDiagnosticHandler handler(src.sourceMgr, &context, os);
  PipelineOptions options;
  if (saveGates >= 0)
    options.saveGates = saveGates != 0;
  std::string text;
  llvm::raw_string_ostream out(text);
  if (llvm::Error e = jit::printStage(*module, *parsed, options, "sm_90", out)) {
    llvm::consumeError(std::move(e));
    throw py::value_error(os.str());
  }
  return {out.str(), os.str()};
}

/// The cell's chunkwise split at `sizes`, after cell-split-projections, as
/// JSON (cell::describeChunkwise): what cellc._chunkwise runs.
std::string chunkwise(const std::string &source, const std::string &fileName,
                      const std::map<std::string, int64_t> &sizes, const std::string &dtype) {
  CellSource src(source, fileName);
  mlir::MLIRContext context;
  auto module = compiled(src, context, sizes, dtype);
  if (llvm::Error e = runToStage(*module, Stage::Split))
    throw py::value_error(llvm::toString(std::move(e)));
  for (auto def : module->getOps<mlir::cell::DefOp>())
    return mlir::cell::describeChunkwise(def);
  throw py::value_error("no cell");
}

/// What a training step of the cell's chunk form holds (jit::planChunkForm),
/// in bytes, as Cell.memory_plan returns it: the step form's keys but
/// piece_steps, and the parts'; ValueError where the chunk form's kernels
/// do not run the cell, with the passes' messages.
py::dict chunkPlan(const std::string &source, const std::string &fileName,
                   const std::map<std::string, int64_t> &sizes, const std::string &dtype,
                   int64_t steps, int64_t batch, const std::string &mode, int64_t chunk) {
  CellSource src(source, fileName);
  mlir::MLIRContext context;
  auto module = compiled(src, context, sizes, dtype);
  auto recompute = parseRecompute(mode);
  if (!recompute)
    throw py::value_error(llvm::toString(recompute.takeError()));
  mlir::SourceMgrDiagnosticHandler handler(src.sourceMgr, &context, src.os);
  auto plans = planChunkForm(*module, dtype, steps, batch, {*recompute}, chunk);
  if (!plans)
    throw py::value_error(src.diagnostics() + llvm::toString(plans.takeError()));
  const ChunkPlan &plan = plans->front();
  py::dict d = python::planDict(plan.total);
  d.attr("pop")("piece_steps");
  for (auto [name, bytes] : std::initializer_list<std::pair<const char *, int64_t>>{
           {"chunk", plan.chunk}, {"prologue_kept", plan.prologueKept},
           {"core_kept", plan.coreKept}, {"between_kept", plan.betweenKept},
           {"epilogue_kept", plan.epilogueKept}})
    d[name] = bytes;
  return d;
}

/// Writes an AOT CUDA package of the cell at `sizes` to `dir`, with the
/// knobs of Knobs.def that the call names (`knobs`: each as text, a word or
/// digits); errors, with the front end's or the passes' messages, raise
/// ValueError.
void package(const std::string &source, const std::string &fileName,
             const std::map<std::string, int64_t> &sizes, const std::string &dir,
             const std::string &arch, const std::map<std::string, std::string> &knobs,
             bool simt, const std::string &simtMutation, const std::string &part) {
  CellSource src(source, fileName);
  mlir::MLIRContext context;
  SizeBindings bindings(sizes.begin(), sizes.end());
  auto module = compileCellSource(context, bindings, mlir::Float32Type::get(&context),
                                  src.diag);
  if (!module)
    raiseCell(src);
  if (!part.empty()) {
    mlir::SourceMgrDiagnosticHandler handler(src.sourceMgr, &context, src.os);
    if (llvm::Error e = takeChunkPart(*module, part))
      throw py::value_error(src.diagnostics() + llvm::toString(std::move(e)));
  }
  auto strategy = knobs.find("strategy");
  bool named = strategy != knobs.end();
  if (named) {
    std::optional<Strategy> kind = parse<Strategy>(strategy->second);
    if (!kind || !isCudaStrategy(*kind))
      throw py::value_error("unknown strategy '" + strategy->second + "'; expected " +
                            name(Strategy::BatchTiled) + " or " +
                            name(Strategy::Persistent));
  }
  PipelineOptions options;
  options.strategy = Strategy::BatchTiled;
  options.target = Target::Cuda;
  for (const auto &[knob, value] : knobs)
    if (llvm::Error e = setKnob(options, knob, value))
      throw py::value_error(llvm::toString(std::move(e)));
  mlir::SourceMgrDiagnosticHandler handler(src.sourceMgr, &context, src.os);
  // No strategy named: chosen as the cellc tool chooses (sharedLimit 0: the
  // architecture's opt-in, if persistent).
  if (!named) {
    if (!knobs.count("shared_limit"))
      options.sharedLimit = 0;
    options = chooseCudaStrategy(*module, options, arch);
  } else if (options.sharedLimit <= 0) {
    options.sharedLimit = PipelineOptions().sharedLimit;
  }
  if (llvm::Error e = writePackage(*module, dir, options, arch, "f32", simt, simtMutation))
    throw py::value_error(src.diagnostics() + llvm::toString(std::move(e)));
}

/// `package(source, file_name, sizes, dir, arch="sm_90", <the knobs of
/// Knobs.def that Python takes, in order>, simt=False, simt_mutation="",
/// part="")`, bound by position or name. A knob given as None or "" is not
/// named; `part` ("prologue") packages that part of the chunkwise form.
void bindPackage(py::args args, py::kwargs kwargs) {
  std::vector<std::string> params = {"source", "file_name", "sizes", "dir", "arch"};
  for (const KnobInfo &knob : kKnobs)
    if (knob.uses & KnobPython)
      params.push_back(knob.name);
  params.push_back("simt");
  params.push_back("simt_mutation");
  params.push_back("part");
  if (args.size() > params.size())
    throw py::type_error("package() takes at most " + std::to_string(params.size()) +
                         " arguments");
  std::map<std::string, py::object> given;
  for (size_t i = 0; i < args.size(); ++i)
    given[params[i]] = args[i];
  for (auto [key, value] : kwargs) {
    std::string name = py::str(key);
    if (std::find(params.begin(), params.end(), name) == params.end())
      throw py::type_error("package() got an unexpected keyword argument '" + name + "'");
    if (!given.emplace(name, py::reinterpret_borrow<py::object>(value)).second)
      throw py::type_error("package() got multiple values for argument '" + name + "'");
  }
  for (size_t i = 0; i < 4; ++i)
    if (!given.count(params[i]))
      throw py::type_error("package() missing argument '" + params[i] + "'");
  auto get = [&](const char *name, auto fallback) {
    auto it = given.find(name);
    return it == given.end() ? fallback : it->second.cast<decltype(fallback)>();
  };
  std::map<std::string, std::string> knobs;
  for (const KnobInfo &knob : kKnobs) {
    auto it = given.find(knob.name);
    if (!(knob.uses & KnobPython) || it == given.end() || it->second.is_none())
      continue;
    std::string text = knob.isWord() ? it->second.cast<std::string>()
                                     : std::to_string(it->second.cast<int64_t>());
    if (!text.empty())
      knobs[knob.name] = text;
  }
  package(given["source"].cast<std::string>(), given["file_name"].cast<std::string>(),
          given["sizes"].cast<std::map<std::string, int64_t>>(),
          given["dir"].cast<std::string>(), get("arch", std::string("sm_90")), knobs,
          get("simt", false), get("simt_mutation", std::string()),
          get("part", std::string()));
}

/// The knobs of Knobs.def as (name, default, help, uses): the default an
/// int or a word, the uses among "cpu", "cuda" and "python".
py::list knobList() {
  py::list knobs;
  for (const KnobInfo &knob : kKnobs) {
    py::list uses;
    static const std::pair<KnobUse, const char *> names[] = {
        {KnobCpu, "cpu"}, {KnobCuda, "cuda"}, {KnobPython, "python"}};
    for (auto [bit, use] : names)
      if (knob.uses & bit)
        uses.append(use);
    py::object value = knob.isWord() ? py::object(py::str(knob.defaultText()))
                                     : py::object(py::int_(knob.defaultValue));
    knobs.append(py::make_tuple(knob.name, value, knob.help, py::tuple(uses)));
  }
  return knobs;
}

} // namespace

/// The names of a cell's per-step outputs: its `output` statement's, or its
/// first state's.
std::vector<std::string> outputNames(const std::string &source,
                                     const std::string &fileName) {
  CellSource src(source, fileName);
  Parser parser(src.text(), src.diag);
  auto cell = parser.parseCell();
  if (!cell)
    raiseCell(src);
  std::vector<std::string> names;
  for (const Stmt &stmt : cell->stmts)
    if (stmt.kind == Stmt::Kind::Output)
      for (const Ident &ident : stmt.names)
        names.push_back(ident.name);
  if (names.empty())
    for (const Decl &decl : cell->decls)
      if (decl.kind == DeclKind::State) {
        names.push_back(decl.ident.name);
        break;
      }
  return names;
}

PYBIND11_MODULE(_cellc, m) {
  m.doc() = "cellc's compiler and JIT (use the cellc package)";

  auto cellError = py::register_exception<CellError>(m, "CellError", PyExc_ValueError);
  py::register_exception<SizeError>(m, "SizeError", cellError.ptr());
  // The words of the kernel interface (KernelInterface.def), so that Python
  // checks and writes them from here: the stages that `cellc --emit` and
  // Cell.emit print, targets, strategies, precisions and storages.
  exportWords<Emit>(m, "Emit");
  exportWords<Target>(m, "Target");
  exportWords<Strategy>(m, "Strategy");
  exportWords<Precision>(m, "Precision");
  exportWords<Storage>(m, "Storage");
  m.def("output_names", &outputNames, py::arg("source"), py::arg("file_name"));

  m.def(
      "prepare_package",
      [](const std::string &source, const std::string &fileName,
         const std::map<std::string, int64_t> &sizes, const std::string &dtype,
         int threads, bool useCache, int64_t batch, bool step,
         std::optional<bool> unitSlices, const std::string &part) {
        if (dtype != "f32" && dtype != "f64")
          throw py::type_error("the CPU backend takes float32 and float64, not " + dtype);
        jit::CpuOptions options;
        options.threads = threads;
        options.useCache = useCache;
        // An explicit thread count is the caller's config; otherwise a tuned
        // one for this batch bucket applies.
        options.batchHint = batch;
        options.useTuned = threads == 0;
        options.step = step;
        options.unitSlices = unitSlices ? int(*unitSlices) : -1;
        options.chunkPart = part;
        SizeBindings bindings(sizes.begin(), sizes.end());
        std::optional<jit::PreparedPackage> prepared;
        {
          py::gil_scoped_release release;
          auto result = jit::prepareCpuPackage(source, fileName, bindings,
                                               dtype == "f32" ? DType::F32 : DType::F64,
                                               options);
          if (!result) {
            py::gil_scoped_acquire acquire;
            raiseError(result.takeError());
          }
          prepared = std::move(*result);
        }
        py::object split = prepared->unitSlices < 0
                               ? py::object(py::none())
                               : py::object(py::bool_(prepared->unitSlices > 0));
        return py::make_tuple(prepared->dir, prepared->fromCache, prepared->origin,
                              prepared->temporary, prepared->threads, split);
      },
      py::arg("source"), py::arg("file_name"), py::arg("sizes"), py::arg("dtype"),
      py::arg("threads") = 0, py::arg("use_cache") = true, py::arg("batch") = 0,
      py::arg("step") = false, py::arg("unit_slices") = py::none(), py::arg("part") = "",
      "Builds the CPU package of the cell at `sizes` (or finds it in the cache): "
      "(path, from_cache, config_source, temporary, threads, unit_slices). With "
      "`step`, the kernels of a streaming step (no hoisted projections); with "
      "`part` (\"prologue\"), that part of the cell's chunkwise form");
  m.def(
      "tuned_config",
      [](const std::string &source, const std::map<std::string, int64_t> &sizes,
         const std::string &dtype, int64_t batch) -> py::object {
        std::string key = tuningKey(source, SizeBindings(sizes.begin(), sizes.end()),
                                    dtype == "f64" ? DType::F64 : DType::F32, batch,
                                    TuneTarget::Cpu, deviceName(TuneTarget::Cpu));
        auto config = lookupTuned(key, TuneTarget::Cpu);
        if (!config) {
          std::string message = llvm::toString(config.takeError()) + "; it is ignored";
          if (PyErr_WarnEx(PyExc_RuntimeWarning, message.c_str(), 1) != 0)
            throw py::error_already_set();
          return py::none();
        }
        if (!*config)
          return py::none();
        return py::cast(**config);
      },
      py::arg("source"), py::arg("sizes"), py::arg("dtype"), py::arg("batch"));
  m.def("tuning_key",
        [](const std::string &source, const std::map<std::string, int64_t> &sizes,
           const std::string &dtype, int64_t batch) {
          return tuningKey(source, SizeBindings(sizes.begin(), sizes.end()),
                           dtype == "f64" ? DType::F64 : DType::F32, batch,
                           TuneTarget::Cpu, deviceName(TuneTarget::Cpu));
        },
        py::arg("source"), py::arg("sizes"), py::arg("dtype"), py::arg("batch"));
  m.def("declarations", &declarations, py::arg("source"), py::arg("file_name"));
  m.def("emit", &emit, py::arg("source"), py::arg("file_name"), py::arg("sizes"),
        py::arg("dtype"), py::arg("stage"), py::arg("save_gates") = -1);
  m.attr("__version__") = CELLC_VERSION;
  m.def("chunkwise", &chunkwise, py::arg("source"), py::arg("file_name"), py::arg("sizes"),
        py::arg("dtype"));
  m.def("chunk_plan", &chunkPlan, py::arg("source"), py::arg("file_name"), py::arg("sizes"),
        py::arg("dtype"), py::arg("steps"), py::arg("batch"), py::arg("mode"),
        py::arg("chunk") = 0);
  m.def("default_chunk_length", &defaultChunkLength, py::arg("steps"));
  m.attr("AUTO_MIN_CHUNKS") = kAutoMinChunks;
  m.def(
      "chunk_kernels_simt",
      [](const std::string &path, const std::string &mutation) {
        if (llvm::Error e = writeChunkKernelsSimt(path, mutation))
          raiseError(std::move(e));
      },
      py::arg("path"), py::arg("mutation") = "",
      "Writes the SIMT emulator's object of the chunk form's CUDA kernels "
      "(runtime/cuda/ChunkKernels.cu) to `path`, with a planted bug "
      "(`mutation`, as package()'s simt_mutation)");
  m.def("cache_dir", []() { return KernelCache::defaultDir(); });
  m.def("compiler_version", []() { return compilerVersion().str(); });
  m.def("package", &bindPackage,
        "package(source, file_name, sizes, dir, arch='sm_90', <the knobs that knobs() "
        "says python takes, in order>, simt=False, simt_mutation='', part=''): writes "
        "an AOT CUDA package (of that part of the cell's chunkwise form)");
  m.def("knobs", &knobList);
}
