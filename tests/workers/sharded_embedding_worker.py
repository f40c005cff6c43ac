"""horovodlike.torch.ShardedEmbedding / ShardedEmbeddingBag against one process training
torch's nn.Embedding / nn.EmbeddingBag on the concatenated global batch with the same torch
optimizer: outputs at every step and the rows after several steps (rtol 1e-6), with SGD, Adagrad,
SparseAdam (sparse gradients) and Adam (dense), Zipf-skewed ids, ids absent from every batch,
ranks with empty batches, block and cyclic sharding, server ranks, padding_idx, max_norm and
scale_grad_by_freq;
each rank's shard checked against the layout computed here; bad input refused before anything
is sent."""

import numpy as np
import torch

import horovodlike.torch as hvd
from common import check, expect_error, raises

hvd.init()
rank, size = hvd.rank(), hvd.size()
ROWS, DIM, STEPS = 61, 3, 4
RTOL = 1e-6


def close(got, expected, what):
    check(got.shape == expected.shape, f"{what}: shape {tuple(got.shape)} vs "
                                       f"{tuple(expected.shape)}")
    if not torch.allclose(got, expected, rtol=RTOL, atol=1e-12):
        raise AssertionError(f"{what}: differs by {(got - expected).abs().max().item():.3g}")


# The ids by frequency: a fixed permutation spreads the frequent ones over the table (so every
# shard has hot and cold rows). The most frequent is the padding_idx where one is tested.
PERMUTATION = torch.randperm(ROWS, generator=torch.Generator().manual_seed(5))
HOTTEST = int(PERMUTATION[0])


def zipf_ids(generator, shape, exponent=1.3):
    """Ids drawn with P(k-th most frequent) ~ 1/k^exponent."""
    weights = 1.0 / torch.arange(1, ROWS + 1, dtype=torch.float64) ** exponent
    count = int(np.prod(shape))
    drawn = torch.multinomial(weights, count, replacement=True, generator=generator) \
        if count else torch.empty(0, dtype=torch.int64)
    return PERMUTATION[drawn].reshape(shape)


def expected_shard_ids(sharding, holders):
    """This rank's rows, worked out independently of the module."""
    if rank not in holders:
        return np.empty(0, dtype=np.int64)
    k, h = holders.index(rank), len(holders)
    if sharding == "block":
        return np.array_split(np.arange(ROWS), h)[k]
    return np.arange(k, ROWS, h)


def check_layout(module, sharding, servers, what, members):
    holders = servers if servers else members
    expected = expected_shard_ids(sharding, holders)
    check(tuple(module.weight.shape) == (len(expected), DIM),
          f"{what}: rank {rank} holds a shard of shape {tuple(module.weight.shape)}, expected "
          f"({len(expected)}, {DIM})")
    check(module.shard_ids.tolist() == expected.tolist(),
          f"{what}: shard ids {module.shard_ids.tolist()} vs {expected.tolist()}")
    total = hvd.allreduce(torch.tensor([module.weight.shape[0]]), op=hvd.Sum,
                          name=f"{what}.rows".replace(" ", "_"), process_set=module.process_set)
    check(int(total) == ROWS, f"{what}: the shards hold {int(total)} rows, not {ROWS}")


def train(what, module, reference, make_optimizer, batches, lookers):
    """STEPS steps: each looking-up rank its batch of the step, the reference on all of them
    concatenated with the loss averaged over those ranks; outputs and rows compared."""
    optimizer, reference_optimizer = make_optimizer([module.weight]), \
        make_optimizer(reference.parameters())
    for step, (call_args, reference_args, splits, targets) in enumerate(batches):
        reference_out = reference(*reference_args)
        loss = (reference_out * torch.cat(targets)).sum() / len(lookers)
        reference_optimizer.zero_grad()
        loss.backward()
        if rank in lookers:
            i = lookers.index(rank)
            out = module(*call_args[i])
            start = sum(splits[:i])
            close(out.detach().reshape(-1, DIM), reference_out.detach()[start:start + splits[i]],
                  f"{what} step {step} output")
            (out.reshape(-1, DIM) * targets[i]).sum().backward()
        else:
            module.serve()
        reference_optimizer.step()
        optimizer.step()
        optimizer.zero_grad()
    close(module.weight.detach(), reference.weight.detach()[module.shard_ids],
          f"{what} rows after {STEPS} steps")


def embedding_batches(generator, lookers, dtype, dtype_of):
    """Per step: every looking-up rank's ids (2-D, a different count each, the last rank's
    empty at step 1), the reference's concatenation, and random targets."""
    steps = []
    for step in range(STEPS):
        shapes = [(0 if (step == 1 and i == len(lookers) - 1) else 1 + (3 * step + 5 * i) % 7, 2)
                  for i in range(len(lookers))]
        ids = [zipf_ids(generator, s).to(dtype_of(i)) for i, s in enumerate(shapes)]
        flat = torch.cat([x.reshape(-1).long() for x in ids])
        targets = [torch.randn(x.numel(), DIM, generator=generator, dtype=dtype) for x in ids]
        steps.append(([(x,) for x in ids], (flat,), [x.numel() for x in ids], targets))
    return steps


def embedding_case(what, make_optimizer, sparse, sharding, servers=None, dtype=torch.float64,
                   process_set=hvd.global_process_set, members=tuple(range(size)), **options):
    """``members``: the ranks of ``process_set``."""
    generator = torch.Generator().manual_seed(len(what))
    full = torch.randn(ROWS, DIM, generator=generator, dtype=dtype)
    members = list(members)
    lookers = [r for r in members if not servers or r not in servers]
    module = hvd.ShardedEmbedding(ROWS, DIM, sparse=sparse, _weight=full, dtype=dtype,
                                  sharding=sharding, servers=servers, process_set=process_set,
                                  **options)
    reference = torch.nn.Embedding(ROWS, DIM, sparse=sparse, _weight=full.clone(), dtype=dtype,
                                   **options)
    check_layout(module, sharding, servers, what, members)
    batches = embedding_batches(generator, lookers, dtype,
                                lambda i: (torch.int32, torch.int64)[i % 2])
    looked_up = set(torch.cat([b[1][0] for b in batches]).tolist())
    check(len(looked_up) < 2 * ROWS // 3, f"{what}: the skewed ids should leave many rows "
                                          f"absent, {len(looked_up)} of {ROWS} looked up")
    train(what, module, reference, make_optimizer, batches, lookers)


def bag_batches(generator, two_d, last_offset):
    """Per step: every rank's (input, offsets, per_sample_weights), the reference's
    concatenation of them, and targets. 1-D bags of uneven sizes, one empty; ``last_offset``:
    the offsets end with the input's length (include_last_offset)."""
    steps = []
    for step in range(STEPS):
        calls, inputs, offsets, weights, bags = [], [], [], [], []
        for i in range(size):
            if two_d:
                ids = zipf_ids(generator, (2 + (step + i) % 3, 4))
                calls.append((ids,))
                inputs.append(ids)
                bags.append(ids.shape[0])
                continue
            sizes = torch.tensor([(step + i + b) % 4 for b in range(3 + i)])   # some bags empty
            ids = zipf_ids(generator, (int(sizes.sum()),))
            starts = torch.cat([torch.tensor([0]), sizes.cumsum(0)[:-1]])
            w = torch.rand(ids.shape, generator=generator, dtype=torch.float64)
            calls.append((ids, torch.cat([starts, sizes.sum(0, keepdim=True)]) if last_offset
                          else starts, w))
            offsets.append(starts + sum(x.numel() for x in inputs))
            inputs.append(ids)
            weights.append(w)
            bags.append(len(sizes))
        ends = [torch.tensor([sum(x.numel() for x in inputs)])] if last_offset else []
        reference_args = (torch.cat(inputs),) if two_d else \
            (torch.cat(inputs), torch.cat(offsets + ends), torch.cat(weights))
        targets = [torch.randn(b, DIM, generator=generator, dtype=torch.float64) for b in bags]
        steps.append((calls, reference_args, bags, targets))
    return steps


class PooledEmbedding(torch.nn.Module):
    """Mean bags of a 2-D input, padding ids left out, from nn.Embedding: the reference for
    scale_grad_by_freq, which torch's own nn.EmbeddingBag (2.x) gets wrong (it divides some
    ids' gradients by another id's count)."""

    def __init__(self, **options):
        super().__init__()
        self.embedding = torch.nn.Embedding(**options)
        self.weight = self.embedding.weight

    def forward(self, input):
        keep = (input != self.embedding.padding_idx).unsqueeze(-1)
        return (self.embedding(input) * keep).sum(1) / keep.sum(1).clamp(min=1)


def bag_case(what, mode, make_optimizer, sharding, two_d, sparse=True, **options):
    generator = torch.Generator().manual_seed(len(what))
    full = torch.randn(ROWS, DIM, generator=generator, dtype=torch.float64)
    module = hvd.ShardedEmbeddingBag(ROWS, DIM, mode=mode, sparse=sparse, _weight=full,
                                     dtype=torch.float64, sharding=sharding, **options)
    if options.get("scale_grad_by_freq"):
        assert mode == "mean" and two_d and not sparse
        reference = PooledEmbedding(num_embeddings=ROWS, embedding_dim=DIM, _weight=full.clone(),
                                    dtype=torch.float64, **options)
    else:
        reference = torch.nn.EmbeddingBag(ROWS, DIM, mode=mode, sparse=sparse,
                                          _weight=full.clone(), dtype=torch.float64, **options)
    check_layout(module, sharding, None, what, list(range(size)))
    batches = bag_batches(generator, two_d, options.get("include_last_offset", False))
    train(what, module, reference, make_optimizer, batches,
          list(range(size)))


def sgd(params):
    return torch.optim.SGD(params, lr=0.5)


def adagrad(params):
    return torch.optim.Adagrad(params, lr=0.3)


def sparse_adam(params):
    return torch.optim.SparseAdam(list(params), lr=0.1)


def adam(params):
    return torch.optim.Adam(params, lr=0.1)


embedding_case("SGD block", sgd, sparse=True, sharding="block")
embedding_case("SparseAdam cyclic float32", sparse_adam, sparse=True, sharding="cyclic",
               dtype=torch.float32)
embedding_case("Adagrad cyclic", adagrad, sparse=True, sharding="cyclic")
embedding_case("SparseAdam block padding", sparse_adam, sparse=True, sharding="block",
               padding_idx=HOTTEST)
# torch refuses scale_grad_by_freq with sparse gradients: the reference can only be dense.
embedding_case("dense Adam cyclic max_norm by frequency", adam, sparse=False, sharding="cyclic",
               max_norm=1.5, scale_grad_by_freq=True)
servers = list(range(size // 2, size))
embedding_case("SparseAdam servers", sparse_adam, sparse=True, sharding="cyclic",
               servers=servers)
# A table per line of a mesh: {0}, {1} on 2 ranks; {0, 1}, {2, 3} on 4.
mesh = hvd.ProcessMesh((2, size // 2), ("dp", "shard"))
embedding_case("SGD per mesh line", sgd, sparse=True, sharding="block",
               process_set=mesh.process_set("shard"), members=sorted(mesh.ranks_along("shard")))
bag_case("bag sum weighted", "sum", adagrad, "block", two_d=False)
bag_case("bag sum weighted last offset", "sum", sgd, "cyclic", two_d=False,
         include_last_offset=True)
bag_case("bag mean 2-D padding", "mean", sgd, "block", two_d=True, padding_idx=HOTTEST)
bag_case("dense bag mean 2-D padding by frequency", "mean", sgd, "cyclic", two_d=True,
         sparse=False, padding_idx=HOTTEST, scale_grad_by_freq=True)

# Without _weight: rows from N(0, 1), the padding row zero where it is held.
padded = hvd.ShardedEmbedding(ROWS, DIM, padding_idx=HOTTEST, sharding="cyclic")
held = padded.shard_ids == HOTTEST
check(bool((padded.weight[held] == 0).all()) and bool((padded.weight[~held] != 0).all()),
      f"rank {rank}: padding row {HOTTEST} not zero, or another row zero: {padded.weight}")



def two_lookups_summed():
    """Two lookups of one table in one loss (both backward passes in one), op=hvd.Sum: the
    shard's gradient is the sum of every rank's, not divided."""
    generator = torch.Generator().manual_seed(11)
    full = torch.randn(ROWS, DIM, generator=generator, dtype=torch.float64)
    module = hvd.ShardedEmbedding(ROWS, DIM, _weight=full, dtype=torch.float64, op=hvd.Sum)
    reference = torch.nn.Embedding(ROWS, DIM, _weight=full.clone(), dtype=torch.float64)
    firsts = [zipf_ids(generator, (3 + r,)) for r in range(size)]
    seconds = [zipf_ids(generator, (2, r)) for r in range(size)]
    t1 = [torch.randn(*x.shape, DIM, generator=generator, dtype=torch.float64) for x in firsts]
    t2 = [torch.randn(*x.shape, DIM, generator=generator, dtype=torch.float64) for x in seconds]
    sum((reference(firsts[r]) * t1[r]).sum() + (reference(seconds[r]) ** 2 * t2[r]).sum()
        for r in range(size)).backward()
    ((module(firsts[rank]) * t1[rank]).sum()
     + (module(seconds[rank]) ** 2 * t2[rank]).sum()).backward()
    close(module.weight.grad, reference.weight.grad[module.shard_ids], "two lookups, hvd.Sum")


two_lookups_summed()
full = torch.arange(ROWS * DIM, dtype=torch.float32).reshape(ROWS, DIM)
pretrained = hvd.ShardedEmbedding.from_pretrained(full, sharding="cyclic")
check(torch.equal(pretrained.weight, full[expected_shard_ids("cyclic", list(range(size)))])
      and not pretrained.weight.requires_grad, f"from_pretrained: {pretrained.weight}")

# Bad input, refused on every rank before anything is sent (nobody would answer otherwise).
table = hvd.ShardedEmbedding(ROWS, DIM, sparse=True)
raises(IndexError, lambda: table(torch.tensor([1, ROWS + rank])), f"rank {rank}",
       f"[{ROWS + rank}]", f"{ROWS} rows")
raises(IndexError, lambda: table(torch.tensor([[-1 - rank]])), f"rank {rank}", f"[{-1 - rank}]")
raises(TypeError, lambda: table(torch.tensor([1.0])), "torch.float32", "torch.int64")
expect_error(lambda: hvd.ShardedEmbedding(ROWS, DIM + (rank == 1)), "embedding_dim",
             f"{DIM} on ranks [0", f"{DIM + 1} on ranks [1]")
expect_error(lambda: hvd.ShardedEmbedding(ROWS, DIM, sharding="diagonal"), "'diagonal'",
             "'block'")
expect_error(lambda: hvd.ShardedEmbedding(ROWS, DIM, servers=list(range(size))),
             "leaves no rank")
expect_error(lambda: hvd.ShardedEmbedding(ROWS, DIM, servers=[size]), f"[{size}]")
raises(NotImplementedError, lambda: hvd.ShardedEmbeddingBag(ROWS, DIM, mode="max"), "'max'")
bag = hvd.ShardedEmbeddingBag(ROWS, DIM, mode="mean")
expect_error(lambda: bag(torch.tensor([1, 2]), torch.tensor([0]), torch.ones(2)),
             "per_sample_weights", "'sum'")
expect_error(lambda: bag(torch.tensor([[1, 2]]), torch.tensor([0])), "offsets must be None")
expect_error(lambda: bag(torch.tensor([1, 2]), torch.tensor([1])), "must start at 0")
served = hvd.ShardedEmbedding(ROWS, DIM, servers=[0])
if rank == 0:
    expect_error(lambda: served(torch.tensor([1])), "rank 0 is a server", "serve()")
# Nothing was sent: the tables still answer lookups in step.
check(torch.equal(table(torch.tensor([rank])), hvd.allgather(table.weight.detach())[[rank]]),
      "a lookup after the refused calls")
print(f"rank {rank}: sharded embedding OK", flush=True)
