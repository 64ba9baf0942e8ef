//===- StepEmitter.cpp - A step's phases, element by element --------------===//

#include "compiler/Conversion/Common/StepEmitter.h"

#include "compiler/Conversion/Common/KernelABI.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/SCF/IR/SCF.h"

#include <map>

namespace mlir::cell {

Value StepEmitter::bufferOf(Value v, Value &slot) {
  slot = Value();
  auto it = sources.find(v);
  if (it != sources.end() && it->second.kind == Source::Shared) {
    slot = it->second.slot;
    return it->second.buffer;
  }
  return sharedOf.lookup(v);
}

void StepEmitter::bindBackwardStep(Block &body, function_ref<Value(unsigned)> arg,
                                   unsigned numInputs, unsigned numOutputs,
                                   unsigned firstDOut, ArrayRef<Value> prevBufs,
                                   ArrayRef<Value> gradBufs, Value slot) {
  sources.clear();
  unsigned a = 0;
  for (unsigned i = 0; i < numInputs; ++i)
    sources[body.getArgument(a++)] = {Source::PerStep, arg(i), {}};
  for (Value prev : prevBufs)
    sources[body.getArgument(a++)] = {Source::Shared, prev, {}};
  for (unsigned i = 0; i < numOutputs; ++i)
    sources[body.getArgument(a++)] = {Source::PerStep, arg(firstDOut + i), {}};
  for (Value grad : gradBufs)
    sources[body.getArgument(a++)] = {Source::Shared, grad, slot};
}

Value StepEmitter::eval(Value v, const Index &i) {
  if (Value hit = lookup(Key(v, i.base, i.offset)))
    return hit;
  // Written in an earlier phase: read it back.
  if (plan && plan->materialized.contains(v) && plan->level(v) < phase) {
    Value slot;
    Value buf = bufferOf(v, slot);
    return remember(v, i, load(buf, slot, at(i)));
  }
  auto it = sources.find(v);
  if (it != sources.end()) {
    const Source &src = it->second;
    Value j = at(i);
    switch (src.kind) {
    case Source::Shared:
      return remember(v, i, load(src.buffer, src.slot, j));
    case Source::PerStep:
      return remember(v, i, loadPerStep(src.buffer, j));
    }
  }
  Operation *op = v.getDefiningOp();
  if (!op) {
    failedEval = true;
    emitError(loc) << "step emitter: a block argument has no buffer";
    return splat(builder, loc, lane, 0.0);
  }
  return remember(v, i, evalOp(op, v, i));
}

Value StepEmitter::evalProduct(Operation *op, const Index &) {
  failedEval = true;
  op->emitOpError("is computed whole by this strategy; it has no element");
  return splat(builder, loc, lane, 0.0);
}

Value StepEmitter::evalBroadcast(Value one) { return eval(one, {index(0), 0, 1}); }

Value StepEmitter::evalOp(Operation *op, Value v, const Index &i) {
  if (auto param = dyn_cast<ParamOp>(op))
    return loadParam(params.lookup(param.getName()), at(i));
  if (auto c = dyn_cast<ConstantOp>(op))
    return splat(builder, loc, lane, c.getValue().convertToDouble());
  if (auto chunk = dyn_cast<ChunkOp>(op)) {
    unsigned k = cast<OpResult>(v).getResultNumber();
    return eval(chunk.getInput(),
                {i.base, i.offset + int64_t(k) * sizeOf(v), i.extent});
  }
  if (auto concat = dyn_cast<ConcatOp>(op))
    return evalConcat(concat, i);
  if (auto restore = dyn_cast<RestoreOp>(op))
    return evalRestore(restore, cast<OpResult>(v).getResultNumber(), i);
  if (auto proj = dyn_cast<ProjectionOp>(op))
    return loadPerStep(projectionBuffers.lookup(op), at(i));
  if (auto broadcast = dyn_cast<BroadcastOp>(op))
    return evalBroadcast(broadcast.getInput());
  if (Value product = products.lookup(op))
    return load(product, Value(), at(i));
  if (PhasePlan::isCrossUnit(op))
    return evalProduct(op, i);
  SmallVector<Value> operands;
  for (Value operand : op->getOperands())
    operands.push_back(eval(operand, i));
  if (Value r = buildElementwise(builder, op, operands, lane))
    return r;
  failedEval = true;
  op->emitOpError("cannot be lowered to a batch-tiled kernel");
  return splat(builder, loc, lane, 0.0);
}

Value StepEmitter::evalConcat(ConcatOp concat, const Index &i) {
  // The part that holds the whole range of `i`, when there is one.
  int64_t start = 0;
  for (Value part : concat.getInputs()) {
    int64_t n = sizeOf(part);
    if (i.offset >= start && i.offset + i.extent <= start + n)
      return eval(part, {i.base, i.offset - start, i.extent});
    start += n;
  }
  // Otherwise choose the part at run time.
  Value j = at(i);
  std::function<Value(unsigned, int64_t)> select = [&](unsigned k,
                                                       int64_t begin) -> Value {
    Value part = concat.getInputs()[k];
    int64_t n = sizeOf(part);
    auto inPart = [&]() {
      scopes.emplace_back();
      Value local = builder.create<arith::SubIOp>(loc, j, index(begin));
      Value r = eval(part, {local, 0, n});
      scopes.pop_back();
      return r;
    };
    if (k + 1 == concat.getInputs().size())
      return inPart();
    Value below = builder.create<arith::CmpIOp>(loc, arith::CmpIPredicate::ult,
                                                j, index(begin + n));
    auto ifOp = builder.create<scf::IfOp>(loc, TypeRange{lane}, below, true, true);
    {
      OpBuilder::InsertionGuard guard(builder);
      builder.setInsertionPointToStart(ifOp.thenBlock());
      builder.create<scf::YieldOp>(loc, inPart());
      builder.setInsertionPointToStart(ifOp.elseBlock());
      builder.create<scf::YieldOp>(loc, select(k + 1, begin + n));
    }
    return ifOp.getResult(0);
  };
  return select(0, 0);
}

Value StepEmitter::evalRestore(RestoreOp restore, unsigned result,
                               const Index &i) {
  // All results of this size at once: one branch on SAVE_GATES for them.
  int64_t n = sizeOf(restore.getResult(result));
  SmallVector<unsigned> group;
  for (unsigned r = 0; r < restore.getNumResults(); ++r)
    if (sizeOf(restore.getResult(r)) == n)
      group.push_back(r);
  SmallVector<int64_t> offsets = packedOffsets(restore.getResultTypes());
  Operation *yield = restore.getBody().front().getTerminator();
  SmallVector<Type> types(group.size(), lane);
  auto ifOp = builder.create<scf::IfOp>(loc, types, saveGates, true, true);
  {
    OpBuilder::InsertionGuard guard(builder);
    builder.setInsertionPointToStart(ifOp.thenBlock());
    SmallVector<Value> loaded;
    for (unsigned r : group)
      loaded.push_back(
          loadPerStep(gates, at({i.base, i.offset + offsets[r], i.extent})));
    builder.create<scf::YieldOp>(loc, loaded);
    builder.setInsertionPointToStart(ifOp.elseBlock());
    scopes.emplace_back();
    SmallVector<Value> replayed;
    for (unsigned r : group)
      replayed.push_back(eval(yield->getOperand(r), i));
    scopes.pop_back();
    builder.create<scf::YieldOp>(loc, replayed);
  }
  Value mine;
  for (auto [k, r] : llvm::enumerate(group)) {
    remember(restore.getResult(r), i, ifOp.getResult(k));
    if (r == result)
      mine = ifOp.getResult(k);
  }
  return mine;
}

LogicalResult StepEmitter::emitPhases(ArrayRef<Item> roots) {
  Value replaying = builder.create<arith::XOrIOp>(
      loc, saveGates, builder.create<arith::ConstantIntOp>(loc, 1, 1));
  // Materialized values are written to their buffers; a concat is written
  // part by part.
  SmallVector<Item> items(roots.begin(), roots.end());
  for (Value m : plan->materialized) {
    Value buf = buffer({sizeOf(m)});
    sharedOf[m] = buf;
    Item item;
    item.value = m;
    Sink sink = [this, buf](OpBuilder &, Location, Value v, Value j,
                            int64_t offset) {
      store(v, buf, Value(), shifted(j, offset));
    };
    item.sinks.push_back({sink, 0});
    // Replay values are only needed when the gates were not saved.
    if (isa<RestoreOp>(m.getParentRegion()->getParentOp()))
      item.guard = replaying;
    items.push_back(item);
  }
  // Split concats into their parts, each written at its offset. A value
  // that is both written out and materialized appears twice; the second
  // evaluation is a cache hit in the same loop.
  SmallVector<std::pair<Item, unsigned>> flat;
  std::function<void(const Item &, unsigned)> split = [&](const Item &item,
                                                          unsigned level) {
    auto concat = item.value.getDefiningOp<ConcatOp>();
    if (!concat) {
      flat.push_back({item, level});
      return;
    }
    int64_t start = 0;
    for (Value part : concat.getInputs()) {
      Item sub = item;
      sub.value = part;
      for (auto &sink : sub.sinks)
        sink.second += start;
      split(sub, level);
      start += sizeOf(part);
    }
  };
  for (const Item &item : items)
    split(item, plan->level(item.value));

  // Whole products, each computed in the first phase whose start has its
  // vector in a buffer.
  SmallVector<Operation *> pending;
  plan->block.walk([&](Operation *op) {
    if (computesProduct(op))
      pending.push_back(op);
  });
  // A per-step input (the operand of a reduction) is copied to a buffer
  // first, like a computed value.
  auto vectorReady = [&](Value vec, unsigned p) {
    auto it = sources.find(vec);
    if (it != sources.end() && it->second.kind == Source::Shared)
      return true;
    return plan->materialized.contains(vec) && plan->level(vec) < p;
  };

  for (unsigned p = 1; p <= plan->numPhases; ++p) {
    phase = p;
    bool anyProduct = false;
    for (Operation *&op : pending) {
      if (!op || !vectorReady(PhasePlan::wholeOperand(op), p))
        continue;
      Value out = productBuffer(op);
      products[op] = out;
      // A replayed product is only needed when the gates were not saved.
      if (op->getParentOfType<RestoreOp>()) {
        auto ifOp = builder.create<scf::IfOp>(loc, replaying, false);
        OpBuilder::InsertionGuard guard(builder);
        builder.setInsertionPoint(ifOp.thenBlock()->getTerminator());
        emitProduct(op, out);
      } else {
        emitProduct(op, out);
      }
      op = nullptr;
      anyProduct = true;
    }
    if (anyProduct) {
      ending = "products";
      barrier();
    }
    // One loop per size: the items of a loop share what they compute.
    std::map<int64_t, SmallVector<unsigned>> bySize;
    for (auto [k, entry] : llvm::enumerate(flat))
      if (entry.second == p)
        bySize[sizeOf(entry.first.value)].push_back(k);
    for (auto &[n, members] : bySize) {
      forEachItemElement(n, [&](Value j) {
        scopes.emplace_back();
        for (unsigned k : members) {
          Item &item = flat[k].first;
          Value v = eval(item.value, {j, 0, n});
          auto write = [&]() {
            for (auto &[sink, offset] : item.sinks)
              sink(builder, loc, v, j, offset);
          };
          Value when = item.guard;
          if (writeGuard)
            when = when ? builder.create<arith::AndIOp>(loc, when, writeGuard).getResult()
                        : writeGuard;
          if (!when) {
            write();
            continue;
          }
          auto ifOp = builder.create<scf::IfOp>(loc, when, false);
          OpBuilder::InsertionGuard guard(builder);
          builder.setInsertionPoint(ifOp.thenBlock()->getTerminator());
          write();
        }
        scopes.pop_back();
      });
    }
    ending = "elements";
    barrier();
  }
  phase = 0;
  return failure(failedEval);
}

BackwardBuffers::BackwardBuffers(StepEmitter &emitter, DefOp def, const BackwardArgs &args,
                                 Operation *ret, bool withSlots) {
  for (Value s : def.getStates()) {
    if (withSlots)
      grad.push_back(emitter.buffer({2, sizeOf(s)}));
    prev.push_back(emitter.buffer({sizeOf(s)}));
    accInit.push_back(emitter.buffer({sizeOf(s)}));
    accStart.push_back(emitter.buffer({sizeOf(s)}));
  }
  for (auto [r, kind] : llvm::enumerate(args.kinds))
    if (kind == cellc::GradKind::Param)
      accParam[r] = emitter.buffer({sizeOf(ret->getOperand(r))});
}

SmallVector<Item> backwardItems(StepEmitter &e, const BackwardArgs &args, Operation *ret,
                                BackwardBuffers &buffers, ArrayRef<Value> gradSlots,
                                Value next, std::function<StepOrigin()> origin, Value zero,
                                function_ref<Sink(unsigned)> perStep) {
  SmallVector<Item> items;
  unsigned stateResult = 0;
  for (auto [r, value] : llvm::enumerate(ret->getOperands())) {
    cellc::GradKind kind = args.kinds[r];
    Item item;
    item.value = value;
    if (kind == cellc::GradKind::State) {
      unsigned i = stateResult++;
      Value slots = gradSlots[i], ai = buffers.accInit[i], as = buffers.accStart[i];
      item.sinks.push_back(
          {[&e, slots, ai, as, next, origin, zero](OpBuilder &, Location, Value v, Value j,
                                                   int64_t offset) {
             OpBuilder &b = e.builder;
             Location l = e.loc;
             j = e.shifted(j, offset);
             StepOrigin from = origin();
             StateGradRoute route =
                 routeStateGrad(b, l, from, v, zero ? zero : splat(b, l, e.lane, 0.0));
             e.store(route.carried, slots, next, j);
             Value oldInit = e.load(ai, Value(), j);
             e.store(b.create<arith::AddFOp>(l, oldInit, route.toInitial), ai, Value(), j);
             Value oldStart = e.load(as, Value(), j);
             e.store(b.create<arith::AddFOp>(l, oldStart, route.toStart), as, Value(), j);
           },
           0});
    } else if (kind == cellc::GradKind::Param) {
      Value acc = buffers.accParam[r];
      item.sinks.push_back(
          {[&e, acc](OpBuilder &, Location, Value v, Value j, int64_t offset) {
             j = e.shifted(j, offset);
             Value old = e.load(acc, Value(), j);
             e.store(e.builder.create<arith::AddFOp>(e.loc, old, v), acc, Value(), j);
           },
           0});
    } else {
      // A per-step result that repeats an earlier one is that result's
      // buffer (its argument says same_as, and the driver passes one
      // buffer): writing it again stored the values twice. An LSTM's
      // gate gradients are both results: its CUDA backward had 56 global
      // stores at H = 32 where it has 40. On the CPU the second streaming
      // store merged with the first, at no measurable cost.
      if (args.sameAs[r] >= 0)
        continue;
      // An input's gradient that is zero (the input reaches the step only
      // through projections, whose GEMMs give it after) is not written: the
      // driver zeroes the caller's buffer, and the argument says zero. Its I
      // elements need not split by head (stepHeads).
      if (kind == cellc::GradKind::Input && isZeroConstant(value))
        continue;
      item.sinks.push_back({perStep(r), 0});
    }
    items.push_back(item);
  }
  return items;
}

} // namespace mlir::cell
