"""A cell's symbolic sizes, bound from the shapes of the tensors a call gives:
the declarations' sizes as text and values, and the one binder, whose errors
name the tensor at fault and what bound each size. Part of cellc.Cell (a
mixin)."""

def _size_text(terms):
    parts = []
    for coefficient, names in terms:
        factors = ([str(coefficient)] if coefficient != 1 or not names else []) + list(names)
        parts.append("*".join(factors))
    return " + ".join(parts)


def _mismatch(kind, name, shape, actual, terms, dim, known, sizes, source):
    """What bind_sizes says of a tensor whose dim `dim` is not the `known`
    value of its declared `terms`: the sizes it reads, and which tensor bound
    each."""
    symbols = sorted({n for t in shape for _, ns in t for n in ns if n in sizes})
    origins = []
    for n in symbols:
        by = source.get(n)
        if by and by[0] == "size":
            origins.append(f"{n}={sizes[n]} from sizes=")
            continue
        origins.append(f"{n}={sizes[n]}" + (f" from {by[0]} '{by[1]}' {list(by[2])}"
                                            if by and by[1] != name else ""))
    # A package's declarations are numbers: no size to name.
    origin = ", ".join(origins)
    if kind == "input":
        expects = f"{_size_text(terms)} = {known} ({origin})" if origin else str(known)
        return f"input '{name}' has width {dim}, but the cell expects {expects}"
    want = "[" + ", ".join(_size_text(t) for t in shape) + "]"
    return (f"{kind} '{name}' is declared {want}" + (f" (with {origin})" if origin else "")
            + f" but the tensor for it has shape {list(actual)}")


def _size_value(terms, sizes):
    """A declared size's value: the sum of its terms, each a coefficient times
    bound symbols."""
    total = 0
    for coefficient, names in terms:
        value = coefficient
        for n in names:
            if n not in sizes:
                raise ValueError(f"the size {n} is not bound; give it as {n}=...")
            value *= sizes[n]
        total += value
    return total


class Sizes:
    """A Cell's sizes: the shapes of its declarations, bound from tensors."""

    def shape(self, name, sizes):
        """The shape of the declared `name` at `sizes` (a dict from size
        symbols to ints)."""
        for _, declared, shape in self._decls:
            if declared == name:
                return [_size_value(terms, sizes) for terms in shape]
        raise KeyError(f"the cell declares no {name!r}")

    def bind_sizes(self, shapes, given=None):
        """Solves the symbolic sizes from `shapes`, a dict from declared names
        to the shapes of the tensors given for them, and `given` (a dict
        from size names to ints: `sizes=` of the call or of compile, for what
        the tensors leave open). The given sizes bind first, then the params,
        then the states, then the inputs: where a tensor disagrees with sizes
        already bound, the error is about that tensor (the data is more often
        the odd one out than the weights) and names what bound them."""
        sizes, source = {}, {}
        for n, v in (given or {}).items():
            if n not in self.size_symbols:
                raise ValueError(f"sizes names {n!r}, which the cell does not use; its sizes "
                                 f"are {', '.join(self.size_symbols) or 'none'}")
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"the size {n} must be a positive int, got {v!r}")
            sizes[n] = v
            source[n] = ("size", "sizes=", (v,))
        pending = []
        first = {"param": 0, "state": 1, "input": 2}
        for kind, name, shape in sorted(self._decls, key=lambda d: first.get(d[0], 3)):
            if name not in shapes:
                continue
            actual = tuple(shapes[name])
            if len(actual) != len(shape):
                want = "[" + ", ".join(_size_text(t) for t in shape) + "]"
                raise ValueError(f"{kind} '{name}' is declared {want} but the tensor for it "
                                 f"has shape {list(actual)}")
            for terms, dim in zip(shape, actual):
                pending.append((kind, name, shape, actual, terms, dim))

        def settle(stage):
            """Binds what the tensors of the kinds in `stage` (None: all)
            determine, until nothing more is."""
            progress = True
            while pending and progress:
                progress = False
                for item in list(pending):
                    kind, name, shape, actual, terms, dim = item
                    if stage is not None and kind not in stage:
                        continue
                    known, unknown = 0, []
                    for coefficient, names in terms:
                        missing = [n for n in names if n not in sizes]
                        value = coefficient
                        for n in names:
                            value *= sizes.get(n, 1)
                        if missing:
                            unknown.append((value, missing))
                        else:
                            known += value
                    if not unknown:
                        if known != dim:
                            raise ValueError(_mismatch(kind, name, shape, actual, terms, dim,
                                                       known, sizes, source))
                        pending.remove(item)
                        progress = True
                    elif len(unknown) == 1 and len(unknown[0][1]) == 1:
                        coefficient, (symbol,) = unknown[0]
                        rest = dim - known
                        if rest <= 0 or rest % coefficient:
                            want = "[" + ", ".join(_size_text(t) for t in shape) + "]"
                            raise ValueError(f"{kind} '{name}' is declared {want} but the "
                                             f"tensor for it has shape {list(actual)}: no size "
                                             f"{symbol} fits")
                        sizes[symbol] = rest // coefficient
                        source[symbol] = (kind, name, actual)
                        progress = True

        # The params first, to a fixed point; then with the states; then all.
        for stage in (("param",), ("param", "state"), None):
            settle(stage)
        if pending or any(n not in sizes for n in self.size_symbols
                          if self._declared_with(n)):
            names = sorted({n for n in self.size_symbols if n not in sizes
                            and self._declared_with(n)})
            raise ValueError(self._unbound(names, shapes))
        return sizes

    def output_dims(self, sizes):
        """For each output, the dims it is declared with where it is a state
        of several (`output S` of `state S: [NH, K, V]`: (NH, K, V)), else
        None: such an output comes as `[T, B, *dims]`."""
        dims = dict(self.states)
        return [tuple(self.shape(n, sizes)) if len(dims.get(n, ())) > 1 else None
                for n in self.outputs]

    def _declared_with(self, size):
        """The declarations whose shapes read `size`: (kind, name, shape)."""
        return [(kind, name, shape) for kind, name, shape in self._decls
                if any(size in ns for t in shape for _, ns in t)]

    def _unbound(self, names, shapes):
        """The message for sizes that the tensors given leave open: which
        declarations would bind each (those not given; those given whose
        dims are products of sizes), and sizes= for the rest."""
        lines = []
        for n in names:
            decls = self._declared_with(n)
            would = [f"{kind} '{name}' [{', '.join(_size_text(t) for t in shape)}]"
                     + ("" if name in shapes else " (not given)")
                     for kind, name, shape in decls]
            lines.append(f"{n}: in {', '.join(would)}")
        example = ", ".join(f"{n!r}: ..." for n in names)
        return (f"cannot bind the sizes {', '.join(names)} from the tensors given ("
                + "; ".join(lines) + "): give the states that declare them (a state's dims "
                f"bind each size alone), or pass sizes={{{example}}}")

    def _state_shapes(self, states, B):
        """The shape of each state given (a dict of `[B, ...]`, or None) without
        its B, for bind_sizes."""
        declared = dict(self.states)
        shapes = {}
        for n, t in (states or {}).items():
            dims = declared.get(n, ["n"])
            if t.dim() != 1 + len(dims) or t.shape[0] != B:
                want = "n" if len(dims) == 1 else ", ".join(map(str, dims))
                raise ValueError(f"state '{n}' must be [B, {want}] with B={B}, got "
                                 f"{list(t.shape)}")
            shapes[n] = tuple(t.shape[1:])
        return shapes
