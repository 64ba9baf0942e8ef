//===- CompilerC.cpp - The compiler's C interface -------------------------===//
//
// cellc_compiler_call: a request's function, from the table at the end, run
// on its JSON arguments. It checks cells, prints their IR and builds
// packages (CPU packages through the JIT's cache, CUDA packages for
// cellc.cuda); the runtime that runs them is libcellc_runtime.so's.
//
//===----------------------------------------------------------------------===//

#include "tools/CompilerC.h"

#include "compiler/Frontend/IRGen.h"
#include "compiler/Frontend/Parser.h"
#include "compiler/Pipelines/Pipelines.h"
#include "dialects/Cell/Transforms/LinearRecurrence.h"
#include "dialects/Cell/Transforms/Passes.h"
#include "jit/ChunkPlan.h"
#include "jit/CpuJit.h"
#include "jit/KernelCache.h"
#include "jit/TuningCache.h"
#include "runtime/driver/CErrors.h"

#include "mlir/IR/Diagnostics.h"
#include "mlir/IR/MLIRContext.h"

#include "llvm/Support/JSON.h"

#include <cstdlib>
#include <optional>

using namespace cellc;
using namespace cellc::jit;
namespace json = llvm::json;

namespace {

/// A failure as Python raises it: its kind (CompilerC.h) and message.
struct Raised {
  std::string kind, message;
};

[[noreturn]] void raise(std::string kind, std::string message) {
  throw Raised{std::move(kind), std::move(message)};
}

/// Raises `error` as Python sees it: a bad cell as "cell" or "size",
/// anything else as "value".
[[noreturn]] void raiseError(llvm::Error error) {
  std::string message, kind = "value";
  llvm::handleAllErrors(
      std::move(error),
      [&](const CellSourceError &e) {
        kind = e.sizeOnly ? "size" : "cell";
        message = e.message;
      },
      [&](const llvm::ErrorInfoBase &e) { message = e.message(); });
  raise(kind, message);
}

/// Raises what the front end reported about `src`.
[[noreturn]] void raiseCell(CellSource &src) { raiseError(src.takeError()); }

/// A call's arguments, read by name with a default where Python has one.
struct Args {
  const json::Object &object;
  std::vector<std::string> *warnings;

  const json::Value *find(llvm::StringRef key) const {
    const json::Value *v = object.get(key);
    return v && v->kind() != json::Value::Null ? v : nullptr;
  }
  std::string str(llvm::StringRef key, std::optional<std::string> fallback = {}) const {
    if (const json::Value *v = find(key))
      if (auto s = v->getAsString())
        return s->str();
    if (fallback)
      return *fallback;
    raise("type", "argument '" + key.str() + "' must be a string");
  }
  int64_t integer(llvm::StringRef key, std::optional<int64_t> fallback = {}) const {
    if (const json::Value *v = find(key)) {
      if (auto i = v->getAsInteger())
        return *i;
      if (auto b = v->getAsBoolean())
        return *b;
    } else if (fallback) {
      return *fallback;
    }
    raise("type", "argument '" + key.str() + "' must be an integer");
  }
  /// A bool, or an integer as Python's truth takes it; a value of another
  /// type is an error, not the default.
  std::optional<bool> maybe(llvm::StringRef key) const {
    const json::Value *v = find(key);
    if (!v)
      return std::nullopt;
    if (auto b = v->getAsBoolean())
      return *b;
    if (auto i = v->getAsInteger())
      return *i != 0;
    raise("type", "argument '" + key.str() + "' must be a bool");
  }
  bool boolean(llvm::StringRef key, bool fallback) const {
    return maybe(key).value_or(fallback);
  }
  std::map<std::string, int64_t> sizes(llvm::StringRef key = "sizes") const {
    std::map<std::string, int64_t> out;
    const json::Value *v = find(key);
    const json::Object *o = v ? v->getAsObject() : nullptr;
    if (!o)
      raise("type", "argument '" + key.str() + "' must be a dict of sizes");
    for (const auto &[name, value] : *o) {
      auto i = value.getAsInteger();
      if (!i)
        raise("type", "size '" + name.str() + "' must be an integer");
      out[name.str()] = *i;
    }
    return out;
  }
  std::map<std::string, std::string> words(llvm::StringRef key) const {
    std::map<std::string, std::string> out;
    if (const json::Value *v = find(key))
      if (const json::Object *o = v->getAsObject())
        for (const auto &[name, value] : *o)
          if (auto s = value.getAsString())
            out[name.str()] = s->str();
    return out;
  }
};

/// The words of an enum as Python's cellc._cellc makes it: [name, help].
template <typename E> json::Array wordsOf() {
  json::Array words;
  for (const Word &w : Words<E>())
    words.push_back(json::Array{w.name, w.help});
  return words;
}

json::Value words(const Args &) {
  return json::Object{{"Emit", wordsOf<Emit>()},
                      {"Target", wordsOf<Target>()},
                      {"Strategy", wordsOf<Strategy>()},
                      {"Precision", wordsOf<Precision>()},
                      {"Storage", wordsOf<Storage>()}};
}

/// The syntax tree of the cell that `a` names, or the front end's error.
auto parsedCell(const Args &a) {
  CellSource src(a.str("source"), a.str("file_name"));
  Parser parser(src.text(), src.diag);
  auto cell = parser.parseCell();
  if (!cell)
    raiseCell(src);
  return cell;
}

/// The declarations of a cell: [kind, name, shape], each size a list of
/// [coefficient, [size names]] terms.
json::Value declarations(const Args &a) {
  auto cell = parsedCell(a);
  json::Array result;
  for (const Decl &decl : cell->decls) {
    json::Array shape;
    for (const SizeExpr &size : decl.shape) {
      json::Array terms;
      for (const auto &term : size.terms) {
        json::Array names;
        for (const Ident &sym : term.symbols)
          names.push_back(sym.name);
        terms.push_back(json::Array{term.coefficient, std::move(names)});
      }
      shape.push_back(std::move(terms));
    }
    result.push_back(json::Array{spell(decl.kind).str(), decl.ident.name, std::move(shape)});
  }
  return result;
}

/// The names of a cell's per-step outputs: its `output` statement's, or its
/// first state's.
json::Value outputNames(const Args &a) {
  auto cell = parsedCell(a);
  json::Array names;
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

/// The cell IR of `src` at `sizes` in `dtype`; a bad dtype raises a type
/// error, a bad cell the front end's error.
mlir::OwningOpRef<mlir::ModuleOp> compiled(CellSource &src, mlir::MLIRContext &context,
                                           const std::map<std::string, int64_t> &sizes,
                                           const std::string &dtype) {
  mlir::FloatType element = parseElementType(context, dtype);
  if (!element)
    raise("type", "unknown dtype " + dtype);
  SizeBindings bindings(sizes.begin(), sizes.end());
  auto module = compileCellSource(context, bindings, element, src.diag);
  if (!module)
    raiseCell(src);
  return module;
}

/// The cell IR at `sizes` printed at `stage`, and the warnings: [text,
/// messages].
json::Value emit(const Args &a) {
  CellSource src(a.str("source"), a.str("file_name"));
  llvm::raw_string_ostream &os = src.os;
  mlir::MLIRContext context;
  auto module = compiled(src, context, a.sizes(), a.str("dtype"));
  std::string stage = a.str("stage");
  std::optional<Emit> parsed = parse<Emit>(stage);
  if (!parsed || *parsed == Emit::Ast || *parsed == Emit::Summary || *parsed == Emit::Ptx ||
      *parsed == Emit::Package || *parsed == Emit::Nvvm || *parsed == Emit::Simt)
    raise("value", "unknown stage '" + stage +
                       "'; expected mlir, split, chunkwise, grad, saves, plan, "
                       "phases, kernels or llvm (ptx: Cell.emit builds the package)");
  mlir::SourceMgrDiagnosticHandler handler(src.sourceMgr, &context, os);
  PipelineOptions options;
  int64_t saveGates = a.integer("save_gates", -1);
  if (saveGates >= 0)
    options.saveGates = saveGates != 0;
  std::string text;
  llvm::raw_string_ostream out(text);
  if (llvm::Error e = jit::printStage(*module, *parsed, options, "sm_90", out)) {
    llvm::consumeError(std::move(e));
    raise("value", os.str());
  }
  return json::Array{out.str(), os.str()};
}

/// The cell's chunkwise split at `sizes`, after cell-split-projections, as
/// JSON text (cell::describeChunkwise): what cellc._chunkwise runs.
json::Value chunkwise(const Args &a) {
  CellSource src(a.str("source"), a.str("file_name"));
  mlir::MLIRContext context;
  auto module = compiled(src, context, a.sizes(), a.str("dtype"));
  if (llvm::Error e = runToStage(*module, Stage::Split))
    raise("value", llvm::toString(std::move(e)));
  for (auto def : module->getOps<mlir::cell::DefOp>())
    return mlir::cell::describeChunkwise(def);
  raise("value", "no cell");
}

/// What a training step of the cell's chunk form holds (jit::planChunkForm):
/// the twelve figures of a memory plan in cellc_cpu_memory_plan's order, and
/// the parts' bytes.
json::Value chunkPlan(const Args &a) {
  CellSource src(a.str("source"), a.str("file_name"));
  mlir::MLIRContext context;
  std::string dtype = a.str("dtype");
  auto module = compiled(src, context, a.sizes(), dtype);
  auto recompute = parseRecompute(a.str("mode"));
  if (!recompute)
    raise("value", llvm::toString(recompute.takeError()));
  mlir::SourceMgrDiagnosticHandler handler(src.sourceMgr, &context, src.os);
  auto plans = planChunkForm(*module, dtype, a.integer("steps"), a.integer("batch"),
                             {*recompute}, a.integer("chunk", 0));
  if (!plans)
    raise("value", src.diagnostics() + llvm::toString(plans.takeError()));
  const ChunkPlan &plan = plans->front();
  json::Array figures;
  for (int64_t figure : plan.total.figures())
    figures.push_back(figure);
  return json::Object{
      {"plan", std::move(figures)},
      {"chunk", plan.chunk},
      {"prologue_kept", plan.prologueKept},
      {"core_kept", plan.coreKept},
      {"between_kept", plan.betweenKept},
      {"epilogue_kept", plan.epilogueKept}};
}

/// Writes an AOT CUDA package of the cell at `sizes` to `dir`, with the
/// knobs that the call names (each as text, a word or digits).
json::Value package(const Args &a) {
  CellSource src(a.str("source"), a.str("file_name"));
  mlir::MLIRContext context;
  auto module = compiled(src, context, a.sizes(), "f32");
  std::string part = a.str("part", std::string());
  if (!part.empty()) {
    mlir::SourceMgrDiagnosticHandler handler(src.sourceMgr, &context, src.os);
    if (llvm::Error e = takeChunkPart(*module, part))
      raise("value", src.diagnostics() + llvm::toString(std::move(e)));
  }
  std::map<std::string, std::string> knobs = a.words("knobs");
  auto strategy = knobs.find("strategy");
  bool named = strategy != knobs.end();
  if (named) {
    std::optional<Strategy> kind = parse<Strategy>(strategy->second);
    if (!kind || !isCudaStrategy(*kind))
      raise("value", "unknown strategy '" + strategy->second + "'; expected " +
                         name(Strategy::BatchTiled) + " or " + name(Strategy::Persistent));
  }
  PipelineOptions options;
  options.strategy = Strategy::BatchTiled;
  options.target = Target::Cuda;
  for (const auto &[knob, value] : knobs)
    if (llvm::Error e = setKnob(options, knob, value))
      raise("value", llvm::toString(std::move(e)));
  std::string arch = a.str("arch", std::string("sm_90"));
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
  if (llvm::Error e = writePackage(*module, a.str("dir"), options, arch, "f32",
                                   a.boolean("simt", false),
                                   a.str("simt_mutation", std::string())))
    raise("value", src.diagnostics() + llvm::toString(std::move(e)));
  return nullptr;
}

/// The knobs of Knobs.def as [name, default, help, uses]: the default an
/// int or a word, the uses among "cpu", "cuda" and "python".
json::Value knobList(const Args &) {
  json::Array knobs;
  for (const KnobInfo &knob : kKnobs) {
    json::Array uses;
    static const std::pair<KnobUse, const char *> names[] = {
        {KnobCpu, "cpu"}, {KnobCuda, "cuda"}, {KnobPython, "python"}};
    for (auto [bit, use] : names)
      if (knob.uses & bit)
        uses.push_back(use);
    json::Value value = knob.isWord() ? json::Value(knob.defaultText())
                                      : json::Value(knob.defaultValue);
    knobs.push_back(json::Array{knob.name, std::move(value), knob.help, std::move(uses)});
  }
  return knobs;
}

/// Builds the CPU package of the cell at `sizes` (or finds it in the
/// cache): [path, from_cache, config_source, temporary, threads,
/// unit_slices].
json::Value preparePackage(const Args &a) {
  std::string dtype = a.str("dtype");
  if (dtype != "f32" && dtype != "f64")
    raise("type", "the CPU backend takes float32 and float64, not " + dtype);
  jit::CpuOptions options;
  options.threads = static_cast<int>(a.integer("threads", 0));
  options.useCache = a.boolean("use_cache", true);
  // An explicit thread count is the caller's config; otherwise a tuned one
  // for this batch bucket applies.
  options.batchHint = a.integer("batch", 0);
  options.useTuned = options.threads == 0;
  options.step = a.boolean("step", false);
  std::optional<bool> unitSlices = a.maybe("unit_slices");
  options.unitSlices = unitSlices ? int(*unitSlices) : -1;
  options.chunkPart = a.str("part", std::string());
  std::map<std::string, int64_t> sizes = a.sizes();
  SizeBindings bindings(sizes.begin(), sizes.end());
  auto result = jit::prepareCpuPackage(a.str("source"), a.str("file_name"), bindings,
                                       dtype == "f32" ? DType::F32 : DType::F64, options);
  if (!result)
    raiseError(result.takeError());
  json::Value split = result->unitSlices < 0 ? json::Value(nullptr)
                                             : json::Value(result->unitSlices > 0);
  return json::Array{result->dir,     result->fromCache, result->origin,
                     result->temporary, result->threads,  std::move(split)};
}

std::string tuningKeyOf(const Args &a) {
  std::map<std::string, int64_t> sizes = a.sizes();
  return tuningKey(a.str("source"), SizeBindings(sizes.begin(), sizes.end()),
                   a.str("dtype") == "f64" ? DType::F64 : DType::F32, a.integer("batch"),
                   TuneTarget::Cpu, deviceName(TuneTarget::Cpu));
}

json::Value tunedConfig(const Args &a) {
  auto config = lookupTuned(tuningKeyOf(a), TuneTarget::Cpu);
  if (!config) {
    a.warnings->push_back(llvm::toString(config.takeError()) + "; it is ignored");
    return nullptr;
  }
  if (!*config)
    return nullptr;
  json::Object out;
  for (const auto &[name, value] : **config)
    out[name] = value;
  return out;
}

json::Value chunkKernelsSimt(const Args &a) {
  if (llvm::Error e = writeChunkKernelsSimt(a.str("path"), a.str("mutation", std::string())))
    raiseError(std::move(e));
  return nullptr;
}

using Function = json::Value (*)(const Args &);

/// Every function a request may name.
const std::pair<const char *, Function> kFunctions[] = {
    {"words", words},
    {"declarations", declarations},
    {"output_names", outputNames},
    {"emit", emit},
    {"chunkwise", chunkwise},
    {"chunk_plan", chunkPlan},
    {"package", package},
    {"knobs", knobList},
    {"prepare_package", preparePackage},
    {"tuning_key", [](const Args &a) -> json::Value { return tuningKeyOf(a); }},
    {"tuned_config", tunedConfig},
    {"chunk_kernels_simt", chunkKernelsSimt},
    {"default_chunk_length",
     [](const Args &a) -> json::Value { return defaultChunkLength(a.integer("steps")); }},
    {"auto_min_chunks", [](const Args &) -> json::Value { return kAutoMinChunks; }},
    {"cache_dir", [](const Args &) -> json::Value { return KernelCache::defaultDir(); }},
    {"compiler_version",
     [](const Args &) -> json::Value { return compilerVersion().str(); }},
};

json::Value answer(const char *request, std::vector<std::string> &warnings) {
  llvm::Expected<json::Value> parsed = json::parse(request ? request : "");
  if (!parsed)
    raise("value", "a request that is not JSON: " + llvm::toString(parsed.takeError()));
  const json::Object *object = parsed->getAsObject();
  const json::Object *args = object ? object->getObject("args") : nullptr;
  std::optional<llvm::StringRef> fn = object ? object->getString("fn") : std::nullopt;
  if (!fn || !args)
    raise("value", "a request without its fn or args");
  for (const auto &[name, function] : kFunctions)
    if (*fn == name)
      return function(Args{*args, &warnings});
  raise("value", "no compiler function '" + fn->str() + "'");
}

} // namespace

extern "C" {

char *cellc_compiler_call(const char *request) {
  std::vector<std::string> warnings;
  json::Object reply;
  try {
    reply["result"] = answer(request, warnings);
  } catch (const Raised &r) {
    reply["error"] = r.kind;
    reply["message"] = r.message;
  } catch (const std::exception &e) {
    reply["error"] = "value";
    reply["message"] = e.what();
  }
  json::Array said;
  for (std::string &w : warnings)
    said.push_back(std::move(w));
  reply["warnings"] = std::move(said);
  std::string text;
  llvm::raw_string_ostream os(text);
  os << json::Value(std::move(reply));
  os.flush();
  return driver::mallocText(text);
}

void cellc_compiler_free_text(char *text) { std::free(text); }

const char *cellc_compiler_version(void) { return CELLC_VERSION; }

} // extern "C"
