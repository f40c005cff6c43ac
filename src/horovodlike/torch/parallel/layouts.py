"""How a tensor is laid out over a tensor-parallel set: ``Shard(dim)`` (each rank holds its
slice of ``dim``, in set order) or ``Replicate()`` (each rank holds all of it), PyTorch's
placement names without DTensor: tensors stay plain local tensors and the layout is what a
parallelize plan says about them.

The convention that makes conversions compose: a replicated tensor's gradient is replicated
too (every rank ends up with the whole, true gradient). A module that uses a replicated input
in a split way (a ColumnParallelLinear) sums the partial gradients itself, so converting
between layouts only ever splits or gathers, forward and backward.
"""

from horovodlike.torch.parallel import mappings

# The tensor's layout travels with it, in place of a DTensor, when a style keeps it
# (use_local_output=False): the next styled module that receives it reads it here.
LAYOUT_ATTRIBUTE = "_horovodlike_layout"


class Shard:
    """Each rank holds its contiguous slice of dimension ``dim`` (negative counts from the
    end)."""

    def __init__(self, dim):
        if not isinstance(dim, int) or isinstance(dim, bool):
            raise ValueError(f"Shard(dim): dim must be an int, got {dim!r}")
        self.dim = dim

    def normalized(self, ndim):
        """The same layout with a non-negative dimension, for a tensor of ``ndim`` dimensions."""
        if not -ndim <= self.dim < ndim:
            raise ValueError(f"Shard({self.dim}) does not fit a tensor of {ndim} dimensions")
        return Shard(self.dim % ndim)

    def __eq__(self, other):
        return isinstance(other, Shard) and other.dim == self.dim

    def __hash__(self):
        return hash(("Shard", self.dim))

    def __repr__(self):
        return f"Shard({self.dim})"


class Replicate:
    """Each rank holds the whole tensor."""

    def normalized(self, ndim):
        return self

    def __eq__(self, other):
        return isinstance(other, Replicate)

    def __hash__(self):
        return hash("Replicate")

    def __repr__(self):
        return "Replicate()"


LAYOUTS = (Shard, Replicate)


def check_layout(layout, what):
    """``layout`` itself, or a clear error saying what ``what`` accepts."""
    if not isinstance(layout, LAYOUTS):
        raise ValueError(f"{what} must be Shard(dim) or Replicate() from "
                         f"horovodlike.torch.parallel, got {layout!r}")
    return layout


def layout_of(tensor, declared):
    """The layout a tensor carries from the style that produced it, else ``declared``."""
    return getattr(tensor, LAYOUT_ATTRIBUTE, None) or declared


def tag(tensor, layout):
    """A view of ``tensor`` that records ``layout`` for the next styled module receiving it
    (a view, so that the caller's own tensor is left unmarked)."""
    tensor = tensor.view_as(tensor)
    setattr(tensor, LAYOUT_ATTRIBUTE, layout)
    return tensor


def redistribute(tensor, source, target, process_set):
    """``tensor`` (this rank's part under ``source``) as its part under ``target``: a gather
    (split backward), a split (gather backward), or both for one shard dimension to another."""
    ndim = tensor.dim()
    source, target = source.normalized(ndim), target.normalized(ndim)
    if source == target:
        return tensor
    if isinstance(source, Shard):
        tensor = mappings.gather_from_tensor_model_parallel_region(tensor, process_set,
                                                                   source.dim)
    if isinstance(target, Shard):
        tensor = mappings.scatter_to_tensor_model_parallel_region(tensor, process_set,
                                                                  target.dim)
    return tensor
