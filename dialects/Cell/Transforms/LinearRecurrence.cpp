//===- LinearRecurrence.cpp - Matrix states with a chunkwise form ---------===//

#include "dialects/Cell/Transforms/LinearRecurrence.h"

#include "dialects/Cell/Transforms/Passes.h"

#include "mlir/IR/AsmState.h"
#include "llvm/ADT/SmallBitVector.h"
#include "llvm/ADT/SmallPtrSet.h"
#include "llvm/Support/Format.h"

#include <algorithm>

namespace mlir::cell {

bool ChunkwiseSplit::qualifies() const {
  return llvm::any_of(states, [](const LinearState &s) { return s.reason.empty(); });
}

namespace {

using Deps = llvm::SmallBitVector;

/// Which of a state's dims holds the heads, the rows (K) and the columns (V);
/// -1 where there is none.
struct Roles {
  int h = -1, k = 0, v = -1;
};

GateKind kindOf(ArrayRef<bool> varies, Roles r) {
  bool onK = varies[r.k];
  bool onV = r.v >= 0 && varies[r.v];
  if (onK && onV)
    return GateKind::Full;
  if (onK)
    return GateKind::Row;
  return onV ? GateKind::Column : GateKind::Scalar;
}

/// `f` as a factor of a product over `dims`: an expand varies along its kept
/// dims, a constant along none, anything else along all of them.
LinearFactor factorOf(Value f, ArrayRef<int64_t> dims, Roles r) {
  LinearFactor out;
  out.vector = f;
  out.varies.assign(dims.size(), true);
  if (auto e = f.getDefiningOp<ExpandOp>(); e && e.getShape() == dims) {
    out.vector = e.getInput();
    out.varies.assign(dims.size(), false);
    for (int64_t d : e.getKept())
      out.varies[d] = true;
  } else if (f.getDefiningOp<ConstantOp>()) {
    out.varies.assign(dims.size(), false);
  }
  out.kind = kindOf(out.varies, r);
  return out;
}

using FactorKey = std::pair<const void *, unsigned>;

SmallVector<FactorKey> keysOf(ArrayRef<LinearFactor> factors) {
  SmallVector<FactorKey> keys;
  for (const LinearFactor &f : factors) {
    unsigned mask = 0;
    for (auto [i, on] : llvm::enumerate(f.varies))
      mask |= on ? 1u << i : 0u;
    keys.push_back({f.vector.getAsOpaquePointer(), mask});
  }
  llvm::sort(keys);
  return keys;
}

/// `all` minus `part` as multisets, or nothing when `part` is not in `all`.
std::optional<SmallVector<LinearFactor>> minus(ArrayRef<LinearFactor> all,
                                               ArrayRef<LinearFactor> part) {
  SmallVector<LinearFactor> rest(all.begin(), all.end());
  for (FactorKey k : keysOf(part)) {
    auto it = llvm::find_if(rest, [&](const LinearFactor &f) {
      return keysOf(f) == SmallVector<FactorKey>{k};
    });
    if (it == rest.end())
      return std::nullopt;
    rest.erase(it);
  }
  return rest;
}

/// One term of a value linear in S: S itself (no source) or a source, times
/// factors.
struct Term {
  SmallVector<LinearFactor> factors;
  bool negated = false;
  Value source;
};
using Form = SmallVector<Term, 2>;

/// The factors of a product: the operands of a tree of cell.mul.
void productFactors(Value v, SmallVectorImpl<Value> &out) {
  if (auto m = v.getDefiningOp<MulOp>()) {
    productFactors(m.getLhs(), out);
    productFactors(m.getRhs(), out);
    return;
  }
  out.push_back(v);
}

/// The analysis of one candidate state under one reading of its dims.
class StateWalk {
public:
  StateWalk(DefOp def, unsigned index, ArrayRef<int64_t> dims, Roles roles,
            const DenseMap<Value, Deps> &deps, const Deps &forbidden)
      : def(def), roles(roles), deps(deps), forbidden(forbidden) {
    state.index = index;
    state.name = cast<StringAttr>(def.getStateNames()[index]).getValue();
    state.dims.assign(dims.begin(), dims.end());
    state.heads = roles.h >= 0;
    state.oneColumn = roles.v < 0;
  }

  LinearState run(SmallPtrSetImpl<Operation *> &core, SmallPtrSetImpl<Operation *> &linearOps);

private:
  bool inGate(Value v) const {
    auto it = deps.find(v);
    return it == deps.end() || !it->second.anyCommon(forbidden);
  }
  void fail(Operation *op, const Twine &why) {
    if (!state.reason.empty())
      return;
    state.reason = why.str();
    state.where = op ? op : def.getOperation();
  }
  LinearFactor factor(Value f) const { return factorOf(f, state.dims, roles); }
  void walkOp(Operation &op);
  void checkGates(const Term &sTerm);
  void checkSource(const Term &term, const Form &yield,
                   SmallPtrSetImpl<Operation *> &core);
  void checkRead(ReduceOp reduce, const Form &form, const Form &yield);
  std::string name(Value v) const;

  DefOp def;
  Roles roles;
  const DenseMap<Value, Deps> &deps;
  const Deps &forbidden;
  LinearState state;
  DenseMap<Value, Form> lin;
  SmallVector<std::pair<ReduceOp, Form>, 4> reads;
};

std::string StateWalk::name(Value v) const {
  std::string text;
  llvm::raw_string_ostream os(text);
  AsmState asmState(def);
  v.printAsOperand(os, asmState);
  return text;
}

void StateWalk::walkOp(Operation &op) {
  auto linOf = [&](Value v) -> const Form * {
    auto it = lin.find(v);
    return it == lin.end() ? nullptr : &it->second;
  };
  auto negate = [](Form f) {
    for (Term &t : f)
      t.negated = !t.negated;
    return f;
  };
  if (auto mul = dyn_cast<MulOp>(op)) {
    const Form *a = linOf(mul.getLhs()), *b = linOf(mul.getRhs());
    if (a && b)
      return fail(&op, state.name + " times itself is not linear in " + state.name);
    Value other = a ? mul.getRhs() : mul.getLhs();
    if (!inGate(other))
      return fail(&op, "scales " + state.name + " by " + name(other) +
                           ", which is computed from " + state.name + " itself");
    Form f = a ? *a : *b;
    LinearFactor g = factor(other);
    for (Term &t : f)
      t.factors.push_back(g);
    lin[mul.getResult()] = std::move(f);
    return;
  }
  if (isa<AddOp, SubOp>(op)) {
    Value lhs = op.getOperand(0), rhs = op.getOperand(1);
    bool sub = isa<SubOp>(op);
    const Form *a = linOf(lhs), *b = linOf(rhs);
    Form f;
    if (a)
      f = *a;
    else
      f.push_back(Term{{}, false, lhs});
    Form g = b ? *b : Form{Term{{}, false, rhs}};
    if (sub)
      g = negate(g);
    f.append(g.begin(), g.end());
    if (llvm::count_if(f, [](const Term &t) { return !t.source; }) > 1)
      return fail(&op, "adds two terms in " + state.name +
                           ": its gate is not one product (write it as one)");
    lin[op.getResult(0)] = std::move(f);
    return;
  }
  if (auto neg = dyn_cast<NegOp>(op)) {
    lin[neg.getResult()] = negate(*linOf(neg.getOperand()));
    return;
  }
  if (auto reduce = dyn_cast<ReduceOp>(op)) {
    if (reduce.getCombineKind() != Combine::Sum)
      return fail(&op, "takes the " + reduce.getCombine().str() + " of " + state.name +
                           ", which is not linear in it");
    reads.push_back({reduce, *linOf(reduce.getInput())});
    return;
  }
  fail(&op, "applies cell." + op.getName().stripDialect().str() + " to " + state.name +
                ", which is not linear in it");
}

void StateWalk::checkGates(const Term &sTerm) {
  for (const LinearFactor &g : sTerm.factors) {
    Operation *at = g.vector.getDefiningOp();
    if (g.kind == GateKind::Full)
      return fail(at, "the gate " + name(g.vector) + " varies along both dims of " +
                          state.name + "'s matrix: it is not a row gate times a column " +
                          "gate, so a chunk of steps is no matrix product");
    if (auto c = g.vector.getDefiningOp<ConstantOp>(); c && c.getValue().convertToDouble() <= 0)
      return fail(at, "the gate " + name(g.vector) + " is a constant that is not positive: " +
                          "its log, which the chunk form sums over steps, is undefined");
    if (g.kind == GateKind::Row && state.oneColumn)
      return fail(at, "the gate " + name(g.vector) + " varies along the units of " +
                          state.name + ", a state of one column a head: its chunk " +
                          "form would cost a chunk's length times the step's work");
  }
  state.gates = sTerm.factors;
}

void StateWalk::checkSource(const Term &term, const Form &yield,
                            SmallPtrSetImpl<Operation *> &core) {
  Operation *at = term.source.getDefiningOp();
  SmallVector<Value> operands;
  productFactors(term.source, operands);
  LinearSource source;
  source.value = term.source;
  source.negated = term.negated;
  Value fromState;
  SmallVector<LinearFactor> factors(term.factors);
  for (Value v : operands) {
    if (inGate(v)) {
      factors.push_back(factor(v));
      continue;
    }
    if (fromState)
      return fail(at, "the update's term " + name(term.source) + " reads " +
                          state.name + " twice");
    fromState = v;
  }
  for (const LinearFactor &f : factors) {
    if (f.kind == GateKind::Full)
      return fail(at, "the update's term " + name(term.source) + " has a factor (" +
                          name(f.vector) + ") that varies along both dims of " +
                          state.name + ": it is not an outer product");
    (f.kind == GateKind::Row ? source.keys
                             : f.kind == GateKind::Column ? source.values : source.scales)
        .push_back(f);
  }
  if (source.keys.empty())
    return fail(at, "the update's term " + name(term.source) + " has no factor along " +
                        state.name + "'s rows (the k of outer(k, v))");
  if (!fromState) {
    if (!state.oneColumn && source.values.empty())
      return fail(at, "the update's term " + name(term.source) +
                          " has no factor along " + state.name +
                          "'s columns (the v of outer(k, v))");
    state.sources.push_back(std::move(source));
    return;
  }
  // The delta rule: outer(k, beta * (w - k^T D(S))), with D the update's gate.
  auto notDelta = [&](const Twine &why) {
    fail(at, "the update's term " + name(term.source) + " is computed from " +
                 state.name + ", and not as the delta rule's outer(k, beta * (v - k @ " +
                 state.name + ")): " + why);
  };
  auto column = fromState.getDefiningOp<ExpandOp>();
  if (state.delta || state.oneColumn || !column || factor(fromState).kind != GateKind::Column)
    return notDelta("its factor " + name(fromState) + " is not a column");
  if (source.keys.size() != 1 || !source.values.empty() || !term.factors.empty())
    return notDelta("it is not one key times one column");
  core.insert(column);
  SmallVector<Value> inner;
  productFactors(column.getInput(), inner);
  Value difference;
  for (Value v : inner) {
    if (!inGate(v)) {
      if (difference)
        return notDelta("two factors read " + state.name);
      difference = v;
      continue;
    }
    auto e = v.getDefiningOp<ExpandOp>();
    bool perHead = v.getDefiningOp<ConstantOp>() ||
                   (e && e.getKept().size() == 1 && e.getKept()[0] == 0 && state.heads);
    if (!perHead)
      return notDelta("its scale " + name(v) + " varies along the columns");
    state.deltaScales.push_back(LinearFactor{e ? e.getInput() : v, {}, GateKind::Scalar});
  }
  core.insert(at);
  if (auto scaled = column.getInput().getDefiningOp<MulOp>())
    core.insert(scaled);
  auto sub = difference.getDefiningOp<SubOp>();
  if (!sub || !inGate(sub.getLhs()))
    return notDelta(name(difference) + " is not v - k @ " + state.name);
  core.insert(sub);
  auto read = llvm::find_if(reads, [&](auto &r) {
    return r.first.getResult() == sub.getRhs();
  });
  if (read == reads.end())
    return notDelta(name(sub.getRhs()) + " is not a read of " + state.name);
  const Form &readForm = read->second;
  if (readForm.size() != 1 || readForm[0].source)
    return notDelta("it reads " + state.name + " after a part of its update");
  // What the read multiplies S by is the update's gate and the key.
  auto rest = minus(readForm[0].factors, yield[0].factors);
  SmallVector<LinearFactor> key{source.keys[0]};
  if (!rest || keysOf(*rest) != keysOf(key) ||
      read->first.getKept() != ArrayRef<int64_t>{0, 2})
    return notDelta("the read-back is not k @ (the gated " + state.name +
                    ") with the key of the update");
  state.delta = true;
  state.deltaKey = source.keys[0].vector;
  state.deltaTarget = sub.getLhs();
}

void StateWalk::checkRead(ReduceOp reduce, const Form &form, const Form &yield) {
  Operation *at = reduce.getOperation();
  if (reduce.getShape() != ArrayRef<int64_t>(state.dims))
    return fail(at, "reads " + state.name + " in another shape");
  SmallVector<bool> kept(state.dims.size(), false);
  for (int64_t d : reduce.getKept())
    kept[d] = true;
  if (state.heads && !kept[roles.h])
    return fail(at, "sums " + state.name + " over its heads");
  LinearRead read;
  read.reduce = reduce;
  if (roles.v < 0) {
    if (kept[roles.k])
      return fail(at, "reads " + state.name + " without summing its units");
  } else if (kept[roles.k] == kept[roles.v]) {
    return fail(at, "reads " + state.name + " to " +
                        (kept[roles.k] ? "itself" : "one value a head") +
                        ": only q @ S and S q have a chunk form");
  }
  read.contractsK = roles.v < 0 || !kept[roles.k];
  SmallVector<LinearFactor> factors;
  bool hasSources = llvm::any_of(form, [](const Term &t) { return bool(t.source); });
  if (!hasSources) {
    read.afterUpdate = false;
    factors = form[0].factors;
  } else {
    // S' times factors F: S's term is the gate and F, every source's term its
    // own factors and F.
    const Term *sTerm = llvm::find_if(form, [](const Term &t) { return !t.source; });
    auto f = sTerm == form.end() ? std::nullopt : minus(sTerm->factors, yield[0].factors);
    bool same = f && form.size() == yield.size() && !sTerm->negated;
    for (const Term &t : form) {
      if (!same || !t.source)
        continue;
      auto match = llvm::find_if(yield, [&](const Term &u) {
        return u.source == t.source && u.negated == t.negated;
      });
      if (match == yield.end()) {
        same = false;
        break;
      }
      SmallVector<LinearFactor> expected(match->factors);
      expected.append(f->begin(), f->end());
      same = keysOf(expected) == keysOf(t.factors);
    }
    if (!same)
      return fail(at, "reads " + state.name + " after a part of its update");
    factors = *f;
  }
  GateKind along = read.contractsK ? GateKind::Row : GateKind::Column;
  for (const LinearFactor &f : factors) {
    if (f.kind == GateKind::Full)
      return fail(at, "reads " + state.name + " through " + name(f.vector) +
                          ", which varies along both of its dims");
    (f.kind == along ? read.queries : read.scales).push_back(f);
  }
  if (read.queries.empty())
    return fail(at, "sums " + state.name + " without a query vector");
  state.reads.push_back(std::move(read));
}

LinearState StateWalk::run(SmallPtrSetImpl<Operation *> &core,
                           SmallPtrSetImpl<Operation *> &linearOps) {
  Block &body = def.getBody().front();
  Value s = def.getStates()[state.index];
  lin[s] = Form{Term{}};
  for (Operation &op : body.without_terminator()) {
    if (llvm::none_of(op.getOperands(), [&](Value v) { return lin.count(v); }))
      continue;
    walkOp(op);
    if (!state.reason.empty())
      return state;
  }
  YieldOp yield = def.getYield();
  for (auto [j, v] : llvm::enumerate(yield.getStates()))
    if (j != state.index && lin.count(v))
      fail(v.getDefiningOp(), "the next " +
                                  cast<StringAttr>(def.getStateNames()[j]).getValue() +
                                  " is " + state.name + " itself, up to a factor");
  for (Value v : yield.getOutputs())
    if (lin.count(v))
      fail(v.getDefiningOp(), "an output is " + state.name +
                                  " itself (or a multiple): the chunk form keeps it only " +
                                  "between chunks");
  Value next = yield.getStates()[state.index];
  if (!lin.count(next))
    fail(next.getDefiningOp(), "the next " + state.name + " is not linear in " + state.name);
  if (!state.reason.empty())
    return state;
  Form update = lin[next];
  auto sTerm = llvm::find_if(update, [](const Term &t) { return !t.source; });
  if (sTerm == update.end() || sTerm->negated) {
    fail(next.getDefiningOp(), "the next " + state.name + " is not a gated " + state.name +
                                   " plus outer products");
    return state;
  }
  // The S term first: reads and sources compare with it.
  std::rotate(update.begin(), sTerm, sTerm + 1);
  checkGates(update[0]);
  for (unsigned i = 1; i < update.size() && state.reason.empty(); ++i)
    checkSource(update[i], update, core);
  if (state.reason.empty() && state.delta && !state.sources.empty())
    fail(state.sources[0].value.getDefiningOp(),
         "the update adds " + name(state.sources[0].value) +
             " beside the delta rule's term: the delta rule with another outer "
             "product has no chunk form yet");
  for (auto &[reduce, form] : reads)
    if (state.reason.empty())
      checkRead(reduce, form, update);
  if (state.reason.empty())
    for (auto &[v, f] : lin)
      if (Operation *op = v.getDefiningOp()) {
        core.insert(op);
        linearOps.insert(op);
      }
  if (state.reason.empty())
    for (auto &r : reads)
      core.insert(r.first);
  return state;
}

/// The block arguments each value depends on, states only: a bit per state.
DenseMap<Value, Deps> stateDeps(DefOp def) {
  unsigned n = def.getStates().size();
  DenseMap<Value, Deps> deps;
  for (auto [i, s] : llvm::enumerate(def.getStates())) {
    deps[s] = Deps(n);
    deps[s].set(i);
  }
  for (Operation &op : def.getBody().front()) {
    Deps d(n);
    for (Value v : op.getOperands())
      if (auto it = deps.find(v); it != deps.end())
        d |= it->second;
    for (Value r : op.getResults())
      deps[r] = d;
  }
  return deps;
}

/// Where `op` is (describeLoc), or nothing for a block argument's absent op.
std::string locationOf(Operation *op) { return op ? describeLoc(op->getLoc()) : ""; }

} // namespace

ChunkwiseSplit analyzeChunkwise(DefOp def) {
  ChunkwiseSplit split;
  auto dimsAttr = def->getAttrOfType<DictionaryAttr>("state_dims");
  unsigned n = def.getStates().size();
  DenseMap<Value, Deps> deps = stateDeps(def);
  YieldOp yield = def.getYield();
  // desc[i]: the states whose next value depends, through any chain of
  // steps, on state i (i included).
  SmallVector<Deps> desc(n, Deps(n));
  for (unsigned i = 0; i < n; ++i)
    desc[i].set(i);
  for (bool grew = true; grew;) {
    grew = false;
    for (unsigned j = 0; j < n; ++j) {
      const Deps &reads = deps[yield.getStates()[j]];
      for (unsigned i = 0; i < n; ++i)
        if (desc[i].anyCommon(reads) && !desc[i].test(j)) {
          desc[i].set(j);
          grew = true;
        }
    }
  }
  SmallPtrSetImpl<Operation *> &core = split.core;
  SmallPtrSet<Operation *, 32> linearOps;
  Deps linear(n);
  for (unsigned i = 0; i < n && dimsAttr; ++i) {
    StringRef name = cast<StringAttr>(def.getStateNames()[i]).getValue();
    auto dims = dyn_cast_or_null<DenseI64ArrayAttr>(dimsAttr.get(name));
    if (!dims)
      continue;
    LinearState result;
    // A state that feeds a state that feeds it back is in a cycle.
    for (unsigned j = 0; j < n && result.reason.empty(); ++j)
      if (j != i && desc[i].test(j) && desc[j].test(i)) {
        result.index = i;
        result.name = name;
        result.dims.assign(dims.asArrayRef().begin(), dims.asArrayRef().end());
        Value other = def.getStates()[j];
        Operation *at = other.use_empty() ? def.getOperation() : *other.user_begin();
        result.reason = (name + " and " +
                         cast<StringAttr>(def.getStateNames()[j]).getValue() +
                         " feed each other: " + name + "'s next value reads " +
                         cast<StringAttr>(def.getStateNames()[j]).getValue() +
                         ", which is computed from " + name)
                            .str();
        result.where = at;
      }
    if (result.reason.empty()) {
      SmallVector<Roles> readings;
      if (dims.size() == 3)
        readings.push_back(Roles{0, 1, 2});
      else if (dims.size() == 2)
        readings.append({Roles{-1, 0, 1}, Roles{0, 1, -1}});
      // A 2-D state is one head's matrix, or else a column per head (mLSTM's
      // normaliser); the first reading's reason is the one reported.
      for (auto [ri, r] : llvm::enumerate(readings)) {
        SmallPtrSet<Operation *, 32> stateCore, stateLinear;
        LinearState attempt = StateWalk(def, i, dims.asArrayRef(), r, deps, desc[i])
                                  .run(stateCore, stateLinear);
        if (ri == 0)
          result = attempt;
        if (attempt.reason.empty()) {
          result = attempt;
          core.insert(stateCore.begin(), stateCore.end());
          linearOps.insert(stateLinear.begin(), stateLinear.end());
          break;
        }
      }
    }
    if (result.reason.empty())
      linear.set(i);
    split.states.push_back(std::move(result));
  }
  // Prologue: what depends on no linear state; core: their updates and reads.
  Deps after(n);
  for (unsigned i = 0; i < n; ++i)
    if (linear.test(i))
      after |= desc[i];
  for (unsigned i = 0; i < n; ++i) {
    if (linear.test(i))
      continue;
    if (after.test(i))
      split.postStates.push_back(i);
    else if (desc[i].anyCommon(linear))
      split.gateOnlyStates.push_back(i);
  }
  for (Operation &op : def.getBody().front().without_terminator()) {
    if (isa<ParamOp, ConstantOp>(op))
      continue;
    ChunkPhase phase = ChunkPhase::Rest;
    if (op.getNumResults() && !deps[op.getResult(0)].anyCommon(after))
      phase = ChunkPhase::Prologue;
    else if (linearOps.contains(&op))
      phase = ChunkPhase::Linear;
    else if (isa<ReduceOp>(op) && core.contains(&op))
      phase = ChunkPhase::Read;
    split.phases[&op] = phase;
    if (phase == ChunkPhase::Prologue)
      ++split.prologueOps;
    else if (core.contains(&op))
      ++split.coreOps;
    else
      ++split.epilogueOps;
  }
  return split;
}

bool readUsedOutsideCore(const LinearRead &read, const ChunkwiseSplit &split) {
  ReduceOp reduce = read.reduce;
  return llvm::any_of(reduce.getResult().getUsers(),
                      [&](Operation *user) { return !split.core.contains(user); });
}

ChunkTemplate chunkTemplateOf(const LinearState &state, const ChunkwiseSplit &split) {
  if (!state.reason.empty())
    return ChunkTemplate::None;
  bool rows = llvm::any_of(state.gates, [](const LinearFactor &f) {
    return f.kind == GateKind::Row;
  });
  bool columns = llvm::any_of(state.gates, [](const LinearFactor &f) {
    return f.kind == GateKind::Column || f.kind == GateKind::Full;
  });
  bool readsFit = llvm::all_of(state.reads, [&](const LinearRead &r) {
    return (r.afterUpdate && r.contractsK) || !readUsedOutsideCore(r, split);
  });
  if (columns || !readsFit)
    return ChunkTemplate::None;
  if (state.delta)
    return rows ? ChunkTemplate::None : ChunkTemplate::Delta;
  return state.sources.size() == 1 ? ChunkTemplate::Diagonal : ChunkTemplate::None;
}

const char *chunkTemplateName(ChunkTemplate t) {
  switch (t) {
  case ChunkTemplate::Diagonal:
    return "diagonal";
  case ChunkTemplate::Delta:
    return "delta";
  case ChunkTemplate::None:
    break;
  }
  return "generic";
}

void printChunkwise(ModuleOp module, llvm::raw_ostream &os) {
  AsmState asmState(module);
  auto name = [&](Value v) {
    std::string text;
    llvm::raw_string_ostream s(text);
    v.printAsOperand(s, asmState);
    return text;
  };
  auto at = [&](Value v) {
    std::string where = locationOf(v.getDefiningOp());
    return where.empty() ? name(v) : name(v) + " (" + where + ")";
  };
  auto kindName = [](GateKind k) {
    switch (k) {
    case GateKind::Scalar:
      return "scalar";
    case GateKind::Row:
      return "row";
    case GateKind::Column:
      return "column";
    case GateKind::Full:
      return "full";
    }
    return "";
  };
  auto logOf = [&](Value g) -> std::string {
    Operation *op = g.getDefiningOp();
    if (isa_and_nonnull<ExpOp>(op))
      return "log-gate " + name(op->getOperand(0));
    if (auto c = dyn_cast_or_null<ConstantOp>(op)) {
      std::string text;
      llvm::raw_string_ostream(text)
          << "log-gate log(" << llvm::format("%g", c.getValue().convertToDouble()) << ")";
      return text;
    }
    if (isa_and_nonnull<SigmoidOp>(op))
      return "log-gate logsigmoid(" + name(op->getOperand(0)) + ")";
    return "log-gate log(" + name(g) + "): not provably positive";
  };
  auto list = [&](ArrayRef<LinearFactor> factors) {
    std::string text;
    for (const LinearFactor &f : factors)
      text += (text.empty() ? "" : " * ") + name(f.vector);
    return text;
  };
  for (DefOp def : module.getOps<DefOp>()) {
    ChunkwiseSplit split = analyzeChunkwise(def);
    os << "cell " << def.getSymName() << ": the chunk form "
       << (split.qualifies() ? "applies" : "does not apply") << "\n";
    if (split.states.empty())
      os << "  no matrix state: every state is a vector, stepped as it is\n";
    for (const LinearState &s : split.states) {
      os << "  state " << s.name << " [";
      llvm::interleave(s.dims, os, ", ");
      os << "]";
      if (!s.reason.empty()) {
        os << ": not a linear recurrence\n    " << locationOf(s.where)
           << (locationOf(s.where).empty() ? "" : ": ") << s.reason << "\n";
        continue;
      }
      os << (s.heads ? " per head" : " one head")
         << (s.oneColumn ? ", one column" : "") << ": "
         << (s.delta ? "delta rule (WY)" : "diagonal") << " transition\n";
      if (s.gates.empty())
        os << "    gate: none\n";
      for (const LinearFactor &g : s.gates)
        os << "    gate: " << kindName(g.kind) << " " << at(g.vector) << ", "
           << logOf(g.vector) << "\n";
      for (const LinearSource &src : s.sources) {
        os << "    source " << name(src.value) << ": " << (src.negated ? "-" : "")
           << "outer(" << list(src.keys) << ", "
           << (src.values.empty() ? "1" : list(src.values)) << ")";
        if (!src.scales.empty())
          os << " * " << list(src.scales);
        os << "\n";
      }
      if (s.delta) {
        os << "    read-back: " << name(s.deltaTarget) << " - " << name(s.deltaKey)
           << " @ " << s.name;
        if (!s.deltaScales.empty())
          os << ", times " << list(s.deltaScales);
        os << "\n";
      }
      for (LinearRead r : s.reads) {
        os << "    read " << at(r.reduce.getResult()) << ": " << list(r.queries)
           << (r.contractsK ? " @ " : " into ") << s.name
           << (r.afterUpdate ? ", after the update" : ", before the update");
        if (!r.scales.empty())
          os << ", times " << list(r.scales);
        os << "\n";
      }
      ChunkTemplate t = chunkTemplateOf(s, split);
      os << "    core: " << chunkTemplateName(t)
         << (t == ChunkTemplate::None ? " (torch's reverse mode over the chunk program)"
                                      : " template (the runtime's chunk kernels)")
         << "\n";
    }
    auto states = [&](ArrayRef<unsigned> indices) {
      std::string text;
      for (unsigned i : indices)
        text += (text.empty() ? "" : ", ") +
                cast<StringAttr>(def.getStateNames()[i]).getValue().str();
      return text.empty() ? std::string("none") : text;
    };
    if (!split.qualifies())
      continue;
    os << "  gate-only states (scanned first): " << states(split.gateOnlyStates) << "\n";
    os << "  states after the core (stepped): " << states(split.postStates) << "\n";
    os << "  ops: prologue " << split.prologueOps << ", core " << split.coreOps
       << ", epilogue " << split.epilogueOps << "\n";
  }
}

} // namespace mlir::cell
