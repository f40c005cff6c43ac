"""Mixture of experts with the experts spread over the ranks of a process set (expert
parallelism): a replicated gate picks each token's top-k experts, the tokens travel to the
ranks holding those experts with one alltoall, come back with another, and are combined
weighted by the gate.

    moe = MoE(d_model=64, make_expert=lambda i: FeedForward(64), num_experts=8, top_k=2,
              capacity_factor=1.25)
    y = moe(x)                          # x: (..., d_model) on every rank, its own tokens
    loss = task_loss(y) + 0.01 * moe.aux_loss
"""

import math

import torch
import torch.nn.functional as F

from horovodlike.common import basics
from horovodlike.common.process_sets import global_process_set, set_ranks
from horovodlike.torch.mpi_ops import alltoall, alltoall_async, synchronize


class MoE(torch.nn.Module):
    """``num_experts`` experts made by ``make_expert(expert_index)`` (each rank builds only
    its own: set rank r holds experts r*E/N .. (r+1)*E/N - 1), and a gate
    ``nn.Linear(d_model, num_experts, bias=False)`` replicated on every rank.

    Each token goes to its ``top_k`` experts (the weights are the gate's softmax, renormalised
    over the chosen experts when top_k > 1). An expert takes at most ``capacity`` tokens from
    each rank, ceil(capacity_factor * tokens * top_k / num_experts); first choices are served
    before second choices, earlier tokens first, and the rest are dropped (they contribute
    zero, so keep a residual connection around the layer). After a forward pass
    ``dropped_tokens`` counts this rank's dropped (token, choice) pairs and ``aux_loss`` is the
    Switch Transformer load-balancing loss of this rank's tokens.

    Gradients flow through both exchanges: an expert's gradient is that of the sum of every
    rank's loss over the tokens it served, so it is already complete (optimise the experts'
    parameters locally, not through DistributedOptimizer, and divide by the set size if the
    other gradients are averaged). The gate's gradient is this rank's own, as in data parallel.
    """

    def __init__(self, d_model, make_expert, num_experts, top_k=1, capacity_factor=1.0,
                 process_set=global_process_set):
        super().__init__()
        ranks = set_ranks(process_set)
        if basics.rank() not in ranks:
            raise ValueError(f"MoE: rank {basics.rank()} is not in the process set {ranks}")
        size = len(ranks)
        if not isinstance(num_experts, int) or num_experts < 1 or num_experts % size:
            raise ValueError(f"MoE: num_experts = {num_experts} must be a positive multiple "
                             f"of the {size} ranks of the process set (each holds as many)")
        if not isinstance(top_k, int) or not 1 <= top_k <= num_experts:
            raise ValueError(f"MoE: top_k = {top_k} must be between 1 and num_experts = "
                             f"{num_experts}")
        if not capacity_factor > 0:
            raise ValueError(f"MoE: capacity_factor = {capacity_factor} must be positive")
        self.d_model, self.num_experts, self.top_k = d_model, num_experts, top_k
        self.capacity_factor, self.process_set = capacity_factor, process_set
        self.set_size, self.set_rank = size, ranks.index(basics.rank())
        self.experts_per_rank = num_experts // size
        first = self.set_rank * self.experts_per_rank
        self.expert_indices = list(range(first, first + self.experts_per_rank))
        self.gate = torch.nn.Linear(d_model, num_experts, bias=False)
        self.experts = torch.nn.ModuleList(make_expert(i) for i in self.expert_indices)
        self.aux_loss = None
        self.dropped_tokens = 0
        self.capacity = None

    def expert_parameters(self):
        """This rank's experts' parameters (their gradients are complete; see the class)."""
        return self.experts.parameters()

    def _route(self, tokens):
        """(token index, expert, weight) of every kept assignment, sorted by expert."""
        count = tokens.shape[0]
        probs = torch.softmax(self.gate(tokens).float(), dim=-1)
        weights, experts = probs.topk(self.top_k, dim=-1)
        if self.top_k > 1:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        self.capacity = math.ceil(self.capacity_factor * count * self.top_k / self.num_experts)
        # Choice-major order: every token's first choice is served before any second choice.
        flat_experts = experts.t().reshape(-1)
        flat_weights = weights.t().reshape(-1)
        flat_tokens = torch.arange(count, device=tokens.device).repeat(self.top_k)
        one_hot = F.one_hot(flat_experts, self.num_experts)
        position = (one_hot.cumsum(dim=0) * one_hot).sum(dim=1) - 1
        keep = position < self.capacity
        self.dropped_tokens = int((~keep).sum())
        # Switch Transformer's balance loss: fraction routed (first choice) times mean prob.
        fraction = F.one_hot(experts[:, 0], self.num_experts).float().mean(dim=0) \
            if count else torch.zeros(self.num_experts, device=probs.device)
        self.aux_loss = self.num_experts * (fraction * probs.mean(dim=0)).sum() \
            if count else probs.sum() * 0.0
        order = torch.argsort(flat_experts[keep], stable=True)
        return flat_tokens[keep][order], flat_experts[keep][order], flat_weights[keep][order]

    def forward(self, x):
        if x.shape[-1] != self.d_model:
            raise ValueError(f"MoE: the input's last dimension is {x.shape[-1]}, expected "
                             f"d_model = {self.d_model}")
        tokens = x.reshape(-1, self.d_model)
        token_index, expert, weight = self._route(tokens)
        splits = torch.bincount(expert // self.experts_per_rank, minlength=self.set_size)
        received, received_splits = alltoall(tokens[token_index], splits,
                                             process_set=self.process_set)
        received_expert, _ = synchronize(alltoall_async(expert, splits,
                                                        process_set=self.process_set))
        local = received_expert - self.set_rank * self.experts_per_rank
        outputs = received.new_zeros(received.shape[0], self.d_model)
        for i, module in enumerate(self.experts):
            rows = (local == i).nonzero(as_tuple=True)[0]
            if rows.numel():
                outputs = outputs.index_copy(0, rows, module(received[rows]).to(outputs.dtype))
        returned, _ = alltoall(outputs, received_splits, process_set=self.process_set)
        combined = tokens.new_zeros(tokens.shape).index_add(
            0, token_index, returned * weight.unsqueeze(1).to(returned.dtype))
        return combined.reshape(x.shape)

    def extra_repr(self):
        return (f"d_model={self.d_model}, num_experts={self.num_experts} "
                f"({self.expert_indices} here), top_k={self.top_k}, "
                f"capacity_factor={self.capacity_factor}")
