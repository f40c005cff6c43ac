"""The styles of a parallelize plan (PyTorch's ``torch.distributed.tensor.parallel`` names):
each says how one module's weights, inputs and outputs are laid out over the tensor-parallel
set. ``check`` refuses a module it cannot handle before anything changes; ``apply`` returns the
module to put in its place (a parallel layer holding this rank's part of the weights, or the
module itself) with hooks that convert its inputs and outputs.

Tensors between modules are always this rank's local part. ``input_layouts`` says what an
input is (unless the style that produced it kept its layout, ``use_local_output=False``);
each style converts it to what it needs and its output to ``output_layouts``.
"""

import torch

from horovodlike.torch.parallel import layers, mappings
from horovodlike.torch.parallel.layouts import (Replicate, Shard, check_layout, layout_of,
                                                redistribute, tag)

_EMBEDDING_OPTIONS = ("padding_idx", "max_norm", "scale_grad_by_freq", "sparse")


def _one_layout(layouts, default, what):
    """A style of one input or output takes a layout or a tuple of one."""
    if layouts is None:
        return default
    if isinstance(layouts, (tuple, list)):
        if len(layouts) != 1:
            raise ValueError(f"{what} takes one layout, got {len(layouts)}: {layouts!r}")
        layouts = layouts[0]
    return check_layout(layouts, what)


def _divisible(name, style, what, size, parts):
    if size % parts != 0:
        raise ValueError(f"parallelize_module: {name!r}: {style} splits {what} = {size} over "
                         f"the {parts} ranks of the tensor-parallel set, which does not "
                         f"divide; make {what} a multiple of {parts}, use a smaller set, or "
                         "leave this module out of the plan")


def _sequence_parallel(layout):
    """The layer options for a sharded side: gathered or reduce-scattered inside the layer,
    along the sharded dimension, its gradient's collective paired there."""
    if isinstance(layout, Shard):
        return {"sequence_parallel": True, "sequence_dim": layout.dim}
    return {"sequence_parallel": False}


def _convert_first(module, args, declared, target, process_set):
    """Forward pre-hook body: the first positional input from its layout to ``target``."""
    if not args or not isinstance(args[0], torch.Tensor):
        return None
    x = args[0]
    return (redistribute(x, layout_of(x, declared), target, process_set),) + tuple(args[1:])


class ParallelStyle:
    """The parts every style shares: its repr (which every rank compares) and keeping the
    output's layout when ``use_local_output`` is False."""

    use_local_output = True
    replaces_module = False   # True: apply() returns a new layer holding part of the weights

    def _finish(self, output, layout):
        if self.use_local_output or not isinstance(output, torch.Tensor):
            return output
        return tag(output, layout)

    def __repr__(self):
        fields = ", ".join(f"{k}={v!r}" for k, v in sorted(vars(self).items()))
        return f"{type(self).__name__}({fields})"


class _LinearOrEmbedding(ParallelStyle):
    """Colwise and Rowwise: an ``nn.Linear`` or an ``nn.Embedding`` with its weight split."""

    replaces_module = True

    def __init__(self, input_layouts, output_layouts, use_local_output, defaults):
        input_default, output_default = defaults
        name = type(self).__name__
        self.input_layouts = _one_layout(input_layouts, input_default, f"{name} input_layouts")
        self.output_layouts = _one_layout(output_layouts, output_default,
                                          f"{name} output_layouts")
        self.use_local_output = use_local_output

    def check(self, name, module, parts):
        style = type(self).__name__
        if isinstance(module, torch.nn.Linear):
            self._check_linear(name, module, parts)
        elif isinstance(module, torch.nn.Embedding):
            # Identity, not equality: padding_idx=0 is set (and 0 == False).
            options = [o for o in _EMBEDDING_OPTIONS
                       if getattr(module, o) is not None and getattr(module, o) is not False]
            if options:
                raise ValueError(f"parallelize_module: {name!r}: {style} does not handle an "
                                 f"nn.Embedding with {', '.join(options)} set; drop it or "
                                 "leave this module out of the plan")
            self._check_embedding(name, module, parts)
        else:
            raise ValueError(f"parallelize_module: {name!r} is a {type(module).__name__}; "
                             f"{style} handles nn.Linear and nn.Embedding only (use "
                             "SequenceParallel for norms and dropout, PrepareModuleInput/"
                             "PrepareModuleOutput for a module holding others)")

    def apply(self, module, process_set):
        if isinstance(module, torch.nn.Linear):
            layer, needs, makes = self._linear(module, process_set)
        else:
            layer, needs, makes = self._embedding(module, process_set)
        layer.to(device=module.weight.device, dtype=module.weight.dtype)
        for name, parameter in layer.named_parameters():
            parameter.requires_grad_(getattr(module, name).requires_grad)   # frozen stays so
        declared = self.input_layouts if self.input_layouts is not None else needs
        wanted = self.output_layouts
        layer.register_forward_pre_hook(
            lambda m, args: _convert_first(m, args, declared, needs, process_set))
        layer.register_forward_hook(lambda m, args, out: self._finish(
            redistribute(out, makes, wanted, process_set), wanted))
        return layer


class ColwiseParallel(_LinearOrEmbedding):
    """Split the outputs: an ``nn.Linear``'s weight and bias by rows (out_features), an
    ``nn.Embedding``'s table by its embedding dimension. The input is whole on every rank
    (``input_layouts=Replicate()``); ``Shard(d)`` says it arrives split along ``d`` (sequence
    parallel), and it is allgathered there, its gradient reduce-scattered. The output is split
    on its last dimension (``Shard(-1)``, ready for a RowwiseParallel); ``Replicate()``
    allgathers it."""

    def __init__(self, *, input_layouts=None, output_layouts=None, use_local_output=True):
        super().__init__(input_layouts, output_layouts, use_local_output,
                         (Replicate(), Shard(-1)))

    def _check_linear(self, name, module, parts):
        _divisible(name, "ColwiseParallel", "out_features", module.out_features, parts)

    def _check_embedding(self, name, module, parts):
        _divisible(name, "ColwiseParallel", "embedding_dim", module.embedding_dim, parts)

    def _linear(self, module, process_set):
        layer = layers.ColumnParallelLinear.from_dense(
            module, process_set=process_set, **_sequence_parallel(self.input_layouts))
        # A sharded input is gathered inside the layer (its gradient reduce-scattered there).
        return layer, self.input_layouts, Shard(-1)

    def _embedding(self, module, process_set):
        layer = layers.ColumnParallelEmbedding.from_dense(module, process_set=process_set)
        return layer, Replicate(), Shard(-1)


class RowwiseParallel(_LinearOrEmbedding):
    """Split the inputs: an ``nn.Linear``'s weight by columns (in_features; the bias stays
    whole), an ``nn.Embedding``'s table by rows (the vocabulary). A linear layer's input is
    split on its last dimension (``Shard(-1)``, a ColwiseParallel's output); an embedding's
    ids are whole (``Replicate()``). The partial results are allreduced into a whole output
    (``output_layouts=Replicate()``), or with ``Shard(d)`` reduce-scattered along ``d``
    (sequence parallel)."""

    def __init__(self, *, input_layouts=None, output_layouts=None, use_local_output=True):
        super().__init__(input_layouts, output_layouts, use_local_output, (None, Replicate()))

    def _check_linear(self, name, module, parts):
        _divisible(name, "RowwiseParallel", "in_features", module.in_features, parts)

    def _check_embedding(self, name, module, parts):
        _divisible(name, "RowwiseParallel", "num_embeddings", module.num_embeddings, parts)

    def _linear(self, module, process_set):
        layer = layers.RowParallelLinear.from_dense(
            module, process_set=process_set, input_is_parallel=True,
            **_sequence_parallel(self.output_layouts))
        return layer, Shard(-1), self.output_layouts

    def _embedding(self, module, process_set):
        layer = layers.VocabParallelEmbedding.from_dense(
            module, process_set=process_set, **_sequence_parallel(self.output_layouts))
        return layer, Replicate(), self.output_layouts


class SequenceParallel(ParallelStyle):
    """Run a module that works position by position (LayerNorm, RMSNorm, dropout) on this
    rank's slice of the sequence (dimension ``sequence_dim``) with its parameters whole on
    every rank; their gradients, each rank's from its own positions, are summed over the set.
    The input is taken to be split on the sequence already (a layout kept by the style that
    produced it wins); the output keeps its ``Shard(sequence_dim)`` layout unless
    ``use_local_output=True``."""

    def __init__(self, *, sequence_dim=1, use_local_output=False):
        self.sequence_dim = Shard(sequence_dim).dim
        self.use_local_output = use_local_output

    def check(self, name, module, parts):
        if isinstance(module, (torch.nn.Linear, torch.nn.Embedding)):
            raise ValueError(f"parallelize_module: {name!r} is a {type(module).__name__}; "
                             "SequenceParallel is for modules that work position by position "
                             "(norms, dropout): use ColwiseParallel or RowwiseParallel")

    def apply(self, module, process_set):
        layout = Shard(self.sequence_dim)
        for parameter in module.parameters():
            if parameter.requires_grad:
                parameter.register_hook(
                    lambda grad: mappings.reduce_from_tensor_model_parallel_region(
                        grad, process_set))
        module.register_forward_pre_hook(
            lambda m, args: _convert_first(m, args, layout, layout, process_set))
        module.register_forward_hook(lambda m, args, out: self._finish(out, layout))
        return module


def _layout_tuple(layouts, what):
    """A tuple of layouts (None: leave that value alone) from a layout or a sequence."""
    if layouts is None:
        return None
    if not isinstance(layouts, (tuple, list)):
        layouts = (layouts,)
    return tuple(None if layout is None else check_layout(layout, what) for layout in layouts)


def _paired(sources, targets, what):
    if (sources is None) != (targets is None) or \
            (sources is not None and len(sources) != len(targets)):
        raise ValueError(f"{what}: the layouts given and the layouts wanted must be the same "
                         f"length (None for a value to leave alone), got {sources!r} and "
                         f"{targets!r}")
    if sources is not None and any((s is None) != (t is None) for s, t in zip(sources, targets)):
        raise ValueError(f"{what}: {sources!r} and {targets!r} must have None at the same "
                         "places")


class _Prepare(ParallelStyle):
    """Converts a module's inputs (PrepareModuleInput) or outputs (PrepareModuleOutput) from
    the layouts they have to the ones wanted, leaving the module and its weights alone."""

    def check(self, name, module, parts):
        pass

    def _convert(self, values, sources, targets, process_set):
        converted = list(values)
        for i, (source, target) in enumerate(zip(sources, targets)):
            value = values[i]
            if source is None or not isinstance(value, torch.Tensor):
                continue
            value = redistribute(value, layout_of(value, source), target, process_set)
            converted[i] = self._finish(value, target)
        return converted


class PrepareModuleInput(_Prepare):
    """Converts a module's positional inputs from ``input_layouts`` to
    ``desired_input_layouts`` (and keyword inputs by name, ``input_kwarg_layouts`` to
    ``desired_input_kwarg_layouts``): for example a sequence-parallel activation allgathered
    (``Shard(1)`` to ``Replicate()``) before an attention block whose projections are
    ColwiseParallel. The converted inputs keep their layout unless ``use_local_output``."""

    def __init__(self, *, input_layouts=None, desired_input_layouts=None,
                 input_kwarg_layouts=None, desired_input_kwarg_layouts=None,
                 use_local_output=False):
        self.input_layouts = _layout_tuple(input_layouts, "PrepareModuleInput input_layouts")
        self.desired_input_layouts = _layout_tuple(
            desired_input_layouts, "PrepareModuleInput desired_input_layouts")
        _paired(self.input_layouts, self.desired_input_layouts, "PrepareModuleInput")
        self.input_kwarg_layouts = dict(input_kwarg_layouts or {})
        self.desired_input_kwarg_layouts = dict(desired_input_kwarg_layouts or {})
        if set(self.input_kwarg_layouts) != set(self.desired_input_kwarg_layouts):
            raise ValueError("PrepareModuleInput: input_kwarg_layouts and "
                             "desired_input_kwarg_layouts must name the same keywords, got "
                             f"{sorted(self.input_kwarg_layouts)} and "
                             f"{sorted(self.desired_input_kwarg_layouts)}")
        for key in self.input_kwarg_layouts:
            check_layout(self.input_kwarg_layouts[key], f"input_kwarg_layouts[{key!r}]")
            check_layout(self.desired_input_kwarg_layouts[key],
                         f"desired_input_kwarg_layouts[{key!r}]")
        self.use_local_output = use_local_output

    def apply(self, module, process_set):
        module.register_forward_pre_hook(
            lambda m, args, kwargs: self._inputs(args, kwargs, process_set), with_kwargs=True)
        return module

    def _inputs(self, args, kwargs, process_set):
        if self.input_layouts is not None:
            n = len(self.input_layouts)
            args = tuple(self._convert(args[:n], self.input_layouts,
                                       self.desired_input_layouts, process_set)) + args[n:]
        keys = [k for k in self.input_kwarg_layouts if k in kwargs]
        values = self._convert([kwargs[k] for k in keys],
                               [self.input_kwarg_layouts[k] for k in keys],
                               [self.desired_input_kwarg_layouts[k] for k in keys], process_set)
        return args, {**kwargs, **dict(zip(keys, values))}


class PrepareModuleOutput(_Prepare):
    """Converts a module's outputs (a tensor or a tuple) from ``output_layouts`` to
    ``desired_output_layouts``: for example a block's sequence-parallel output allgathered
    (``Shard(1)`` to ``Replicate()``) for a loss that needs the whole sequence."""

    def __init__(self, *, output_layouts, desired_output_layouts, use_local_output=True):
        self.output_layouts = _layout_tuple(output_layouts, "PrepareModuleOutput output_layouts")
        self.desired_output_layouts = _layout_tuple(
            desired_output_layouts, "PrepareModuleOutput desired_output_layouts")
        _paired(self.output_layouts, self.desired_output_layouts, "PrepareModuleOutput")
        self.use_local_output = use_local_output

    def apply(self, module, process_set):
        module.register_forward_hook(lambda m, args, out: self._outputs(out, process_set))
        return module

    def _outputs(self, out, process_set):
        single = not isinstance(out, tuple)
        converted = self._convert((out,) if single else out, self.output_layouts,
                                  self.desired_output_layouts, process_set)
        return converted[0] if single else tuple(converted)
