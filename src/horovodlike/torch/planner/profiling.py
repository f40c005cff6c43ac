"""What the planner measures of a model: each layer's compute time on the input sizes the
layouts will give it, its sizes, and which of its Linears tensor parallelism pairs up."""

import dataclasses
import statistics
import time

import torch


@dataclasses.dataclass
class LayerProfile:
    """One layer (a child of a sequential model), measured in this process.

    ``forward_s``/``backward_s`` and ``activation_bytes`` are for the whole sample batch of
    ``batch`` rows. Tensor parallelism pairs the model's Linears in order, Megatron's column
    then row: ``split_s`` is the part of forward + backward that such a split divides (the
    paired Linears, whole layers between a column and its row, and inside a layer the work
    between a column and its row), ``tp_messages`` the bytes
    of each allreduce over tp a step of the whole batch needs here (the row's output in
    forward, the column's input gradient in backward). ``timings`` maps "rows/tp" to the
    forward + backward seconds measured on ``rows`` rows with the paired Linears cut ``tp``
    ways; other sizes are scaled from the whole batch. ``update_s``: the optimizer's step on
    the layer's parameters, which every training step pays once after its gradients are in
    (profiles written before it was measured hold 0)."""
    name: str
    forward_s: float
    backward_s: float
    activation_bytes: int   # its output for the whole batch
    parameter_bytes: int
    splittable: bool        # tensor parallelism divides some of its compute
    tp_sizes: tuple = ()    # the feature sizes tensor parallelism must divide
    split_s: float = None   # None: all of forward + backward when splittable, else none
    tp_messages: tuple = ()
    timings: dict = dataclasses.field(default_factory=dict)
    batch: int = 0
    update_s: float = 0.0   # the optimizer's step on its parameters (once per training step)

    def __post_init__(self):
        if self.split_s is None:
            self.split_s = self.forward_s + self.backward_s if self.splittable else 0.0
        self.tp_sizes, self.tp_messages = tuple(self.tp_sizes), tuple(self.tp_messages)


def timing_key(rows, tp):
    return f"{rows}/{tp}"


def median_time(fn, repeats):
    """The median of ``repeats`` runs after two warm-ups (the first calls allocate and start
    autograd's threads). calibrate() profiles on one rank while the others wait, so the
    figures are a rank's alone on a core; the cost model applies each layout's sharing of the
    cores (cost_model.Contention)."""
    for _ in range(2):
        fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


class InterleavedTimer:
    """Times pieces of work in interleaved rounds, each piece once a round, and keeps each
    one's median over the rounds: a burst of load from elsewhere then touches every figure a
    little instead of one figure a lot."""

    def __init__(self):
        self._work = {}

    def add(self, key, work):
        self._work.setdefault(key, work)

    def run(self, repeats):
        for work in self._work.values():   # warm-up: the first calls allocate
            work()
            work()
        samples = {key: [] for key in self._work}
        for _ in range(repeats):
            for key, work in self._work.items():
                start = time.perf_counter()
                work()
                samples[key].append(time.perf_counter() - start)
        return {key: statistics.median(values) for key, values in samples.items()}


def _forward_work(module, x):
    def forward():
        with torch.no_grad():
            module(x)
    return forward


def _forward_backward_work(module, x):
    x = x.detach().requires_grad_(x.is_floating_point())

    def forward_backward():
        out = module(x)
        if out.requires_grad:
            out.backward(torch.ones_like(out))
    return forward_backward


@dataclasses.dataclass
class _LinearCall:
    layer: int              # the child it belongs to
    module: torch.nn.Linear
    input_shape: tuple
    input_bytes: int
    output_bytes: int
    role: str = ""          # "column", "row" or "" (unpaired: not split)


def linear_calls(children, sample_input):
    """Every Linear called in one forward, in call order, paired column/row as Megatron's
    tensor parallelism splits them (an odd last Linear stays whole)."""
    calls, hooks = [], []
    for index, child in enumerate(children):
        for module in child.modules():
            if isinstance(module, torch.nn.Linear):
                def record(mod, inputs, out, index=index):
                    calls.append(_LinearCall(index, mod, tuple(inputs[0].shape),
                                             inputs[0].numel() * inputs[0].element_size(),
                                             out.numel() * out.element_size()))
                hooks.append(module.register_forward_hook(record))
    try:
        with torch.no_grad():
            x = sample_input
            for child in children:
                x = child(x)
    finally:
        for hook in hooks:
            hook.remove()
    for column, row in zip(calls[0::2], calls[1::2]):
        column.role, row.role = "column", "row"
    return calls


def _shard_work(call, rows, tp):
    """Forward + backward of ``call``'s Linear on ``rows`` rows, cut ``tp`` ways."""
    module = call.module
    inputs, outputs = module.in_features, module.out_features
    if tp > 1 and call.role == "column":
        outputs //= tp
    elif tp > 1 and call.role == "row":
        inputs //= tp
    linear = torch.nn.Linear(inputs, outputs, bias=module.bias is not None)
    return _forward_backward_work(linear, torch.randn((rows, *call.input_shape[1:-1], inputs)))


def _between_pairs(calls):
    """Layers strictly between a column and its row in another layer: they compute on the
    column's slice (an activation, say), so tensor parallelism divides them whole."""
    inside = set()
    for column, row in zip(calls[0::2], calls[1::2]):
        inside.update(range(column.layer + 1, row.layer))
    return inside


def slice_share(child, calls, x, repeats):
    """The share of ``child``'s forward time spent between the end of a column inside it and
    the start of its row (an attention core, an activation: work on the column's slice),
    timed with module hooks; the backward is taken to split alike."""
    pairs = [(c.module, r.module) for c, r in zip(calls[0::2], calls[1::2])
             if any(m is c.module for m in child.modules())
             and any(m is r.module for m in child.modules())]
    if not pairs:
        return 0.0
    stamps, between, hooks = {}, [0.0], []
    for column, row in pairs:
        hooks.append(column.register_forward_hook(
            lambda *_, key=id(row): stamps.__setitem__(key, time.perf_counter())))
        hooks.append(row.register_forward_pre_hook(
            lambda mod, _: between.__setitem__(0, between[0] + time.perf_counter()
                                               - stamps.pop(id(mod), time.perf_counter()))))
    shares = []
    try:
        with torch.no_grad():
            for _ in range(repeats + 1):
                between[0] = 0.0
                start = time.perf_counter()
                child(x)
                shares.append(between[0] / max(time.perf_counter() - start, 1e-12))
    finally:
        for hook in hooks:
            hook.remove()
    return statistics.median(shares[1:])


def _split_time(whole, full, cut, share, tp, between_pairs):
    """A layer's forward + backward at tensor parallel ``tp`` from its ``whole`` time: its
    paired Linears take ``cut`` instead of ``full``, the work on a column's slice (its
    ``share`` of the whole, or all of it for a layer ``between_pairs``) is divided by tp."""
    if tp == 1:
        return whole
    if between_pairs:
        return whole / tp
    on_slice = whole * share
    return max(whole - full - on_slice, 0.0) + cut + on_slice / tp


def _run_prefix(children, x):
    outs = []
    with torch.no_grad():
        for child in children:
            outs.append(x)
            x = child(x)
    return outs, x


def default_optimizer(parameters):
    """The optimizer profile_layers times the step of when none is given: plain SGD."""
    return torch.optim.SGD(parameters, lr=1e-3)


def _update_work(child, optimizer):
    """(update, restore) for ``child``, None for a layer without parameters: ``update()``
    takes a step of ``optimizer(parameters)`` on its parameters with gradients in place;
    ``restore()`` puts the parameters back as they were before the first and drops the
    gradients (the profile leaves the model as it found it)."""
    parameters = [p for p in child.parameters() if p.requires_grad]
    if not parameters:
        return None
    saved = [p.detach().clone() for p in parameters]
    grads = [torch.ones_like(p) for p in parameters]
    step = optimizer(parameters)

    def update():
        for p, g in zip(parameters, grads):
            p.grad = g
        step.step()

    def restore():
        with torch.no_grad():
            for p, value in zip(parameters, saved):
                p.copy_(value)
                p.grad = None
    return update, restore


def _timed_work(children, calls, sample_input, sizes, optimizer=default_optimizer):
    """Every piece profile_layers times, in an InterleavedTimer, the rows it covers and the
    parameters' restorers (the timed optimizer steps move them)."""
    batch = sample_input.shape[0]
    tps = {batch: {1}}
    for rows, tp in sizes:
        if 0 < rows <= batch:
            tps.setdefault(rows, {1}).add(tp)
    timer = InterleavedTimer()
    for rows in sorted(tps):
        prefix, _ = _run_prefix(children, sample_input[:rows])
        for index, (child, x) in enumerate(zip(children, prefix)):
            timer.add(("both", index, rows), _forward_backward_work(child, x))
            if rows == batch:
                timer.add(("forward", index), _forward_work(child, x))
        for number, call in enumerate(calls):
            for tp in sorted(tps[rows]) if call.role else ():
                timer.add(("linear", number, rows, tp), _shard_work(call, rows, tp))
    restorers = []
    for index, child in enumerate(children):
        work = _update_work(child, optimizer)
        if work is not None:
            timer.add(("update", index), work[0])
            restorers.append(work[1])
    return timer, tps, restorers


def sequential_children(model):
    """The layers of a sequential ``model``; a clear error for any other model."""
    children = list(model.children()) if isinstance(model, torch.nn.Sequential) else None
    if not children:
        raise ValueError("plan: the model must be a torch.nn.Sequential (its children are the "
                         "layers that stages are cut between), got "
                         f"{type(model).__name__}")
    return children


def profile_layers(model, sample_input, sizes=(), repeats=7, optimizer=None):
    """LayerProfile of every child of a sequential ``model`` on ``sample_input`` (the whole
    batch), and on each (rows, tp) of ``sizes``: the first ``rows`` rows of it, with the
    paired Linears cut ``tp`` ways (the per-rank work of a layout). ``optimizer``: a function
    of a list of parameters returning the torch optimizer training will use (its step is
    timed on each layer's parameters); plain SGD when None."""
    children = sequential_children(model)
    batch = sample_input.shape[0]
    calls = linear_calls(children, sample_input)
    inside = _between_pairs(calls)
    inputs, _ = _run_prefix(children, sample_input)
    shares = [slice_share(child, calls, x, repeats) for child, x in zip(children, inputs)]
    timer, tps, restorers = _timed_work(children, calls, sample_input, sizes,
                                        optimizer or default_optimizer)
    try:
        times = timer.run(repeats)
    finally:
        for restore in restorers:
            restore()
    for child in children:
        child.zero_grad(set_to_none=True)

    def linears(index, rows, tp):
        return sum(times[("linear", n, rows, tp)] for n, c in enumerate(calls)
                   if c.layer == index and c.role)
    profiles = []
    for index, (child, x) in enumerate(zip(children, inputs)):
        forward_s, both = times[("forward", index)], times[("both", index, batch)]
        with torch.no_grad():
            out = child(x)
        mine = [c for c in calls if c.layer == index and c.role]
        split = both if index in inside else both * shares[index] + linears(index, batch, 1)
        profiles.append(LayerProfile(
            name=f"{index}:{type(child).__name__}", forward_s=forward_s,
            backward_s=max(both - forward_s, 0.0),
            activation_bytes=out.numel() * out.element_size(),
            parameter_bytes=sum(p.numel() * p.element_size() for p in child.parameters()),
            splittable=bool(mine) or index in inside,
            tp_sizes=tuple(c.module.out_features for c in mine if c.role == "column"),
            split_s=min(split, both),
            tp_messages=tuple(c.output_bytes if c.role == "row" else c.input_bytes
                              for c in mine),
            timings={timing_key(rows, tp): _split_time(
                times[("both", index, rows)], linears(index, rows, 1), linears(index, rows, tp),
                shares[index], tp, index in inside)
                for rows, tp in sizes if rows in tps},
            batch=batch, update_s=times.get(("update", index), 0.0)))
    return profiles
