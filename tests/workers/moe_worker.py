"""horovodlike.torch.moe.MoE against a single-process mixture of experts with the same gate
and experts, written as a plain loop over tokens: outputs, input/gate/expert gradients, the
balance loss and dropped-token counts; top-1 and top-2, each with and without drops, uneven token
counts per rank; and bad input refused before anything is sent."""

import math

import torch

import horovodlike.torch as hvd
from horovodlike.torch.moe import MoE
from common import check, expect_error

hvd.init()
rank, size = hvd.rank(), hvd.size()
D, EXPERTS = 4, 2 * size


def make_expert(index):
    torch.manual_seed(100 + index)
    return torch.nn.Sequential(torch.nn.Linear(D, 6), torch.nn.Tanh(), torch.nn.Linear(6, D))


def close(got, expected, what):
    check(got.shape == expected.shape, f"{what}: shape {tuple(got.shape)} vs "
                                       f"{tuple(expected.shape)}")
    check(torch.allclose(got, expected, rtol=1e-5, atol=1e-6),
          f"{what}: differs by {(got - expected).abs().max().item():.3g}")


def reference_moe(gate, experts, x, top_k, capacity_factor):
    """One rank's tokens through every expert, token by token: (output, dropped, aux)."""
    probs = torch.softmax(gate(x), dim=-1)
    capacity = math.ceil(capacity_factor * x.shape[0] * top_k / len(experts))
    served = [0] * len(experts)
    out = [torch.zeros(D) for _ in range(x.shape[0])]
    dropped = 0
    ranked = [sorted(range(len(experts)), key=lambda e: -probs[t, e].item())[:top_k]
              for t in range(x.shape[0])]
    for choice in range(top_k):
        for t in range(x.shape[0]):
            e = ranked[t][choice]
            chosen = probs[t, ranked[t]]
            weight = probs[t, e] / chosen.sum() if top_k > 1 else probs[t, e]
            if served[e] < capacity:
                served[e] += 1
                out[t] = out[t] + weight * experts[e](x[t:t + 1])[0]
            else:
                dropped += 1
    firsts = torch.tensor([ranked[t][0] for t in range(x.shape[0])])
    fraction = torch.stack([(firsts == e).float().mean() for e in range(len(experts))])
    aux = len(experts) * (fraction * probs.mean(dim=0)).sum()
    return torch.stack(out), dropped, aux


def run(top_k, capacity_factor, expect_drops):
    tokens = [5 + r for r in range(size)]           # uneven: rank r has 5 + r tokens
    g = torch.Generator().manual_seed(top_k)
    xs = [torch.randn(n, D, generator=g) for n in tokens]
    rs = [torch.randn(n, D, generator=g) for n in tokens]
    torch.manual_seed(7)
    moe = MoE(D, make_expert, EXPERTS, top_k=top_k, capacity_factor=capacity_factor)
    x = xs[rank].clone().requires_grad_()
    y = moe(x)
    ((y * rs[rank]).sum() + moe.aux_loss).backward()

    torch.manual_seed(7)
    gate = torch.nn.Linear(D, EXPERTS, bias=False)
    experts = [make_expert(e) for e in range(EXPERTS)]
    ref_xs = [t.clone().requires_grad_() for t in xs]
    total, drops = 0.0, []
    for r in range(size):
        out, dropped, aux = reference_moe(gate, experts, ref_xs[r], top_k, capacity_factor)
        total = total + (out * rs[r]).sum() + aux
        drops.append(dropped)
        if r == rank:
            mine = out.detach(), aux.detach()
    total.backward()

    what = f"top_k={top_k} capacity_factor={capacity_factor}"
    close(y.detach(), mine[0], f"{what} output")
    close(moe.aux_loss.detach(), mine[1], f"{what} aux loss")
    close(x.grad, ref_xs[rank].grad, f"{what} input gradient")
    check(moe.dropped_tokens == drops[rank], f"{what}: {moe.dropped_tokens} dropped, "
                                             f"expected {drops[rank]}")
    check((sum(drops) > 0) == expect_drops, f"{what}: drops {drops}")
    # The gate is replicated: the sum of the ranks' gradients is the dense gradient.
    gate_grad = hvd.allreduce(moe.gate.weight.grad, op=hvd.Sum, name=f"gate.{top_k}.{capacity_factor}")
    close(gate_grad, gate.weight.grad, f"{what} gate gradient")
    for local, e in enumerate(moe.expert_indices):
        for p, q in zip(moe.experts[local].parameters(), experts[e].parameters()):
            expected = q.grad if q.grad is not None else torch.zeros_like(q)
            got = p.grad if p.grad is not None else torch.zeros_like(p)
            close(got, expected, f"{what} expert {e} gradient")


# Each top_k with a capacity that takes every token and with one that drops some.
run(top_k=1, capacity_factor=float(EXPERTS), expect_drops=False)
run(top_k=1, capacity_factor=0.5, expect_drops=True)
run(top_k=2, capacity_factor=float(EXPERTS), expect_drops=False)
run(top_k=2, capacity_factor=0.5, expect_drops=True)


expect_error(lambda: MoE(D, make_expert, EXPERTS, top_k=EXPERTS + 1),
             f"top_k = {EXPERTS + 1}", f"num_experts = {EXPERTS}")
expect_error(lambda: MoE(D, make_expert, 2 * size + 1), f"num_experts = {2 * size + 1}",
             f"multiple of the {size} ranks")
expect_error(lambda: MoE(D, make_expert, EXPERTS)(torch.randn(3, D + 1)), "d_model = 4")
print(f"rank {rank}: moe OK", flush=True)
