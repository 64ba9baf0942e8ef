//===- ChunkwiseDescription.cpp - A cell's chunkwise split as JSON --------===//

#include "dialects/Cell/Transforms/LinearRecurrence.h"

#include "llvm/Support/JSON.h"

namespace mlir::cell {

DenseMap<Value, int64_t> chunkwiseIds(DefOp def) {
  DenseMap<Value, int64_t> ids;
  Block &body = def.getBody().front();
  for (Value arg : body.getArguments())
    ids.try_emplace(arg, ids.size());
  for (Operation &op : body.without_terminator())
    for (Value r : op.getResults())
      ids.try_emplace(r, ids.size());
  return ids;
}

std::string describeChunkwise(DefOp def) {
  ChunkwiseSplit split = analyzeChunkwise(def);
  DenseMap<Value, int64_t> ids = chunkwiseIds(def);
  auto id = [&](Value v) -> int64_t { return ids.lookup(v); };
  auto idList = [&](ValueRange values) {
    llvm::json::Array list;
    for (Value v : values)
      list.push_back(id(v));
    return list;
  };
  llvm::json::Object out;
  out["name"] = def.getSymName().str();
  out["inputs"] = idList(def.getInputs());
  out["states"] = idList(def.getStates());
  llvm::json::Array ops;
  for (Operation &op : def.getBody().front().without_terminator()) {
    llvm::json::Object o;
    o["op"] = op.getName().stripDialect().str();
    o["operands"] = idList(op.getOperands());
    o["results"] = idList(op.getResults());
    llvm::json::Array sizes;
    for (Value r : op.getResults())
      sizes.push_back(cast<ShapedType>(r.getType()).getNumElements());
    o["sizes"] = std::move(sizes);
    auto phase = split.phases.find(&op);
    ChunkPhase p = phase == split.phases.end() ? ChunkPhase::Prologue : phase->second;
    o["phase"] = p == ChunkPhase::Prologue ? "prologue"
                 : p == ChunkPhase::Linear ? "linear"
                 : p == ChunkPhase::Read   ? "read"
                                           : "rest";
    if (auto param = dyn_cast<ParamOp>(op)) {
      o["name"] = param.getName().str();
      o["shape"] = llvm::json::Array(cast<ShapedType>(param.getType()).getShape());
    }
    if (auto c = dyn_cast<ConstantOp>(op))
      o["value"] = c.getValue().convertToDouble();
    if (auto e = dyn_cast<ExpandOp>(op)) {
      o["shape"] = llvm::json::Array(e.getShape());
      o["kept"] = llvm::json::Array(e.getKept());
    }
    if (auto r = dyn_cast<ReduceOp>(op)) {
      o["shape"] = llvm::json::Array(r.getShape());
      o["kept"] = llvm::json::Array(r.getKept());
      o["combine"] = r.getCombine().str();
    }
    if (isa<MatvecOp, ProjectionOp, VecmatOp>(op))
      o["weight_shape"] =
          llvm::json::Array(cast<ShapedType>(op.getOperand(0).getType()).getShape());
    ops.push_back(std::move(o));
  }
  out["ops"] = std::move(ops);
  YieldOp yield = def.getYield();
  out["yield_states"] = idList(yield.getStates());
  out["yield_outputs"] = idList(yield.getOutputs());
  auto factors = [&](ArrayRef<LinearFactor> list) {
    llvm::json::Array a;
    for (const LinearFactor &f : list) {
      llvm::json::Array varies;
      for (bool b : f.varies)
        varies.push_back(b);
      a.push_back(llvm::json::Object{{"vector", id(f.vector)}, {"varies", std::move(varies)}});
    }
    return a;
  };
  llvm::json::Array linear, reasons;
  for (const LinearState &s : split.states) {
    if (!s.reason.empty()) {
      reasons.push_back(llvm::json::Object{{"state", s.name.str()}, {"reason", s.reason}});
      continue;
    }
    llvm::json::Object l;
    l["state"] = s.index;
    l["dims"] = llvm::json::Array(s.dims);
    l["heads"] = s.heads;
    l["one_column"] = s.oneColumn;
    l["gates"] = factors(s.gates);
    llvm::json::Array sources;
    for (const LinearSource &src : s.sources)
      sources.push_back(llvm::json::Object{{"keys", factors(src.keys)},
                                           {"values", factors(src.values)},
                                           {"scales", factors(src.scales)},
                                           {"negated", src.negated}});
    l["sources"] = std::move(sources);
    llvm::json::Array reads;
    for (LinearRead r : s.reads)
      reads.push_back(llvm::json::Object{{"result", id(r.reduce.getResult())},
                                         {"contracts_k", r.contractsK},
                                         {"after", r.afterUpdate},
                                         {"used", readUsedOutsideCore(r, split)},
                                         {"queries", factors(r.queries)},
                                         {"scales", factors(r.scales)}});
    l["reads"] = std::move(reads);
    ChunkTemplate t = chunkTemplateOf(s, split);
    l["template"] = t == ChunkTemplate::None ? llvm::json::Value(nullptr)
                                             : llvm::json::Value(chunkTemplateName(t));
    if (s.delta) {
      l["delta_key"] = id(s.deltaKey);
      l["delta_target"] = id(s.deltaTarget);
      llvm::json::Array scales;
      for (const LinearFactor &f : s.deltaScales)
        scales.push_back(id(f.vector));
      l["delta_scales"] = std::move(scales);
    }
    linear.push_back(std::move(l));
  }
  out["linear"] = std::move(linear);
  out["reasons"] = std::move(reasons);
  llvm::json::Array gateOnly, post;
  for (unsigned i : split.gateOnlyStates)
    gateOnly.push_back(i);
  for (unsigned i : split.postStates)
    post.push_back(i);
  out["gate_only"] = std::move(gateOnly);
  out["post"] = std::move(post);
  std::string text;
  llvm::raw_string_ostream os(text);
  os << llvm::json::Value(std::move(out));
  return text;
}

} // namespace mlir::cell
