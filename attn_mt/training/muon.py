"""Muon for the layers' weight matrices, AdamW for the rest, as one optimizer.

Muon (Jordan et al. 2024; Liu et al. 2025, "Muon is Scalable for LLM Training") keeps a Nesterov
momentum of each 2-D weight's gradient and steps along its orthogonalised version: Newton-Schulz
iterations map the momentum M = U S V^T to about U V^T, so every direction of the update moves at
the same rate. The step is scaled by 0.2 sqrt(max(rows, cols)) so that its RMS matches AdamW's, and
one learning rate (and schedule) serves both kinds of parameters (Liu et al.'s "match_rms_adamw").

`torch.optim.Muon` runs the iterations in bf16 whatever the parameters are: on a CPU without bf16
instructions (AVX2 only) one iteration on a 256 x 1024 gradient took 546 ms against 20.8 ms in fp32
(one thread). Here they run in `ns_dtype`, the training precision: bf16 where the run trains in
bf16, else fp32. Their cost is per step: 5 iterations cost a 1024-token step of the speedrun's model
a quarter more time, so `ns_schedule="polar"` offers a coefficient sequence whose 3 iterations
flatten about as far as 5 fixed ones.

    >>> opt = MuonAdamW(model, lr=2e-3, betas=(0.9, 0.98), weight_decay=0.0, ns_steps=3,
    ...                 ns_schedule="polar")
    ... # doctest: +SKIP
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from attn_mt.models.attention import MultiHeadAttention

# Jordan et al.'s quintic, the same at every iteration (torch.optim.Muon's): 5 map singular values
# in [0.003, 1] into [0.68, 1.2]
NS_COEFFICIENTS = (3.4445, -4.7750, 2.0315)
# one quintic per iteration (Amsel et al. 2025, "The Polar Express"): the i-th is the odd quintic
# nearest to 1 in the max norm over the singular values the ones before it leave, 2% more at the top
# so that rounding cannot push one past where the next is designed (beyond it they grow fast). From
# [0.005, 1], 3 map them into [0.49, 1.51] (Jordan et al.'s 3: 0.005 -> 0.20, 0.01 -> 0.40);
# tests/training/test_muon.py derives them again.
POLAR_COEFFICIENTS = ((8.139355, -23.033951, 16.394354), (3.851871, -2.764312, 0.508516),
                      (3.158766, -2.283946, 0.457732), (2.198144, -1.535275, 0.382219),
                      (1.866844, -1.222922, 0.356371))
Coefficients = tuple[tuple[float, float, float], ...]


def ns_coefficients(steps: int, schedule: str = "fixed") -> Coefficients:
    """The (a, b, c) of each of `steps` Newton-Schulz iterations: Jordan et al.'s at every one
    ("fixed"), or the Polar Express sequence ("polar", at most 5)."""
    if schedule == "polar":
        if steps > len(POLAR_COEFFICIENTS):
            raise ValueError(f"the polar schedule has {len(POLAR_COEFFICIENTS)} iterations, not "
                             f"{steps}")
        return POLAR_COEFFICIENTS[:steps]
    return (NS_COEFFICIENTS,) * steps


def orthogonalise(g: Tensor, coefficients: Coefficients,
                  dtype: torch.dtype = torch.float32) -> Tensor:
    """(R, C) matrix, or (N, R, C) matrices -> about U V^T of each one's SVD (singular values near
    1), by one Newton-Schulz iteration per (a, b, c) in `coefficients`: X <- p(X X^T) X with p(G) =
    a I + b G + c G^2.

    In fp32, a matrix at least twice as wide as it is tall (on its wide side: the feed-forward
    weights, the fused Q/K/V projection, one head's slice of it) iterates on its Gram matrix instead
    (`gram_iterations`): the same X up to rounding (1e-6), with a quarter to a third less
    arithmetic. bf16 keeps the plain iteration: the Gram matrix squares the singular values' spread,
    past what bf16's 8 bits resolve (a nearly rank-one momentum, common in the first steps, came out
    with singular values of 1e4: test).
    """
    x = g.to(dtype)
    tall = x.size(-2) > x.size(-1)
    if tall:
        x = x.mT  # iterate on the wide side: the Gram matrix x x^T is the smaller one
    # spectral norm <= Frobenius norm = 1
    x = x / x.norm(dim=(-2, -1), keepdim=True).clamp(min=1e-7)
    if dtype == torch.float32 and x.size(-1) >= 2 * x.size(-2):
        x = gram_iterations(x, coefficients)
    else:
        for a, b, c in coefficients:
            gram = x @ x.mT  # (R, R)
            # a x + (b G + c G^2) x
            x = _addmm(x, _addmm(gram, gram, gram, beta=b, alpha=c), x, beta=a)
    return x.mT if tall else x


def gram_iterations(x: Tensor, coefficients: Coefficients) -> Tensor:
    """Newton-Schulz iterations of a wide (R, C) matrix (or N of them), one per (a, b, c), carried
    out on the (R, R) side.

    p(G) is a polynomial in G = X X^T, so it commutes with G: the next Gram matrix is p(G) G p(G) =
    p(G)^2 G, and X after k iterations is P_k ... P_1 X, needed only at the end. Per iteration 4 (R,
    R) products instead of 2 (R, C) ones and 1 (R, R): for C >= 2R the same result costs less.
    """
    if not coefficients:
        return x
    gram = x @ x.mT  # (R, R)
    eye = torch.eye(x.size(-2), dtype=x.dtype, device=x.device)
    product = None  # P_i ... P_1, (R, R)
    for i, (a, b, c) in enumerate(coefficients):
        # a I + b G + c G^2, (R, R)
        p = _addmm(gram, gram, gram, beta=b, alpha=c).add_(eye, alpha=a)
        product = p if product is None else p @ product
        if i < len(coefficients) - 1:
            gram = p @ (p @ gram)
    return product @ x  # (R, C)


def _addmm(x: Tensor, a: Tensor, b: Tensor, *, beta: float, alpha: float = 1.0) -> Tensor:
    """beta x + alpha a @ b, for matrices (addmm) or stacks of them (baddbmm)."""
    return (torch.addmm if x.dim() == 2 else torch.baddbmm)(x, a, b, beta=beta, alpha=alpha)


def muon_params(model: nn.Module) -> set[str]:
    """Names of the parameters Muon updates: the weights of the model's linear layers (attention
    projections, feed-forward), not the embedding tables nor the output layer (`out_proj`, often
    tied to them)."""
    tables = {id(m.weight) for m in model.modules() if isinstance(m, nn.Embedding)}
    return {f"{name}.weight" for name, m in model.named_modules()
            if isinstance(m, nn.Linear) and name != "out_proj" and id(m.weight) not in tables
            and m.weight.requires_grad and min(m.weight.shape) > 1}


def head_cuts(model: nn.Module) -> dict[str, tuple[str, int]]:
    """{weight name: ("rows" or "cols", blocks)}: how the attention projections' weights split into
    heads. A projection into heads (Q/K/V, fused or not) holds d_head rows per head; the output
    projection d_head columns per head."""
    cuts = {}
    for name, m in model.named_modules():
        if isinstance(m, MultiHeadAttention):
            for child, linear in m.named_children():
                if isinstance(linear, nn.Linear):
                    cuts[f"{name}.{child}.weight"] = (("cols", m.n_heads) if child == "out_proj"
                                                      else ("rows", linear.out_features // m.d_k))
    return cuts


def orthogonalise_heads(g: Tensor, cut: tuple[str, int], coefficients: Coefficients,
                        dtype: torch.dtype = torch.float32) -> Tensor:
    """(R, C) weight-shaped update -> each head's block orthogonalised on its own, as one stack
    (`head_cuts`)."""
    return from_blocks(orthogonalise(to_blocks(g, cut), coefficients, dtype), cut)


class MuonAdamW(torch.optim.AdamW):
    """AdamW whose parameter groups flagged `muon` are updated by Muon instead.

    Both kinds live in one optimizer, so a checkpoint keeps one state dict (Muon's momentum under
    "momentum_buffer", AdamW's moments as usual) and a resumed run restores it like AdamW's. With
    `per_head` the attention projections' updates are orthogonalised head by head (`head_cuts`): 64
    x 256 blocks of a 256-wide model instead of 768 x 256 and 256 x 256 matrices: a fifth of the
    time in fp32 (test: each block as if orthogonalised alone).
    """

    def __init__(self, model: nn.Module, *, lr: float, betas: tuple[float, float],
                 weight_decay: float, momentum: float = 0.95, ns_steps: int = 5,
                 ns_schedule: str = "fixed", ns_dtype: torch.dtype = torch.float32,
                 per_head: bool = False) -> None:
        names = muon_params(model)
        params = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
        groups = [{"params": [p for n, p in params if n in names], "muon": True},
                  {"params": [p for n, p in params if n not in names], "muon": False}]
        super().__init__([g for g in groups if g["params"]], lr=lr, betas=betas,
                         weight_decay=weight_decay)
        self.momentum, self.ns_dtype = momentum, ns_dtype
        self.ns = ns_coefficients(ns_steps, ns_schedule)
        cuts = head_cuts(model) if per_head else {}
        # {parameter: its heads' cut}
        self.cuts = {p: cuts[n] for n, p in params if n in names and n in cuts}

    @torch.no_grad()
    def step(self, closure=None):  # noqa: ANN001 (torch's signature)
        """Muon on the flagged groups; their gradients are then dropped, so AdamW's step skips them.

        The blocks that are orthogonalised (whole matrices, or heads with `per_head`) are stacked by
        shape, so all blocks of one shape take one batched product per Newton-Schulz iteration
        (`orthogonalise_stacked`), on a GPU and on a CPU with two threads or more: on 2 cores the
        Muon step of configs/multi30k.yaml took 0.74x (bf16) and 0.76x (fp32) of the blocks' time
        one by one; on one thread 0.99x and 1.06x, so there each goes alone (docs/performance.md).
        """
        for group in self.param_groups:
            if not group["muon"]:
                continue
            params, moments = [], []
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                # "step" too: AdamW's load_state_dict expects it in every parameter's state
                if not state:
                    state["step"], state["momentum_buffer"] = torch.tensor(0.0), torch.zeros_like(p)
                state["step"] += 1
                buf = state["momentum_buffer"]
                buf.lerp_(p.grad, 1 - self.momentum)
                params.append(p)
                moments.append(p.grad.lerp(buf, self.momentum))  # Nesterov
            stack = bool(params) and (params[0].device.type != "cpu" or torch.get_num_threads() > 1)
            updates = orthogonalise_stacked(moments, [self.cuts.get(p) for p in params], self.ns,
                                            self.ns_dtype, stack)
            for p, (update, block) in zip(params, updates, strict=True):
                if group["weight_decay"]:
                    p.mul_(1 - group["lr"] * group["weight_decay"])
                # AdamW's RMS; bf16 too
                p.add_(update, alpha=-group["lr"] * 0.2 * math.sqrt(max(block)))
                p.grad = None
        return super().step(closure)


def to_blocks(g: Tensor, cut: tuple[str, int] | None) -> Tensor:
    """(R, C) -> (n, r, c): the matrix itself (n = 1), or its heads' blocks (`head_cuts`)."""
    if cut is None:
        return g.unsqueeze(0)
    (rows, cols), (axis, n) = g.shape, cut
    return (g.reshape(n, rows // n, cols) if axis == "rows"
            else g.reshape(rows, n, cols // n).transpose(0, 1))


def from_blocks(x: Tensor, cut: tuple[str, int] | None) -> Tensor:
    """`to_blocks` undone: (n, r, c) -> (R, C)."""
    if cut is None:
        return x[0]
    n, r, c = x.shape
    return x.reshape(n * r, c) if cut[0] == "rows" else x.transpose(0, 1).reshape(r, n * c)


def orthogonalise_stacked(grads: list[Tensor], cuts: list[tuple[str, int] | None],
                          coefficients: Coefficients, dtype: torch.dtype = torch.float32,
                          stack: bool = True) -> list[tuple[Tensor, torch.Size]]:
    """Each (R, C) matrix orthogonalised as a whole (cut None) or head by head; with `stack` every
    block of one shape in one stack: one batched Newton-Schulz run per block shape (a few large
    products instead of many small ones; on one CPU thread the copies cost about what they save).
    Returns (update, block shape) per matrix; each update equals `orthogonalise` /
    `orthogonalise_heads` of its matrix alone, up to rounding (exactly, without `stack`)."""
    blocks = [to_blocks(g, cut) for g, cut in zip(grads, cuts, strict=True)]  # (n_i, r, c) each
    groups: dict = {}
    for i, b in enumerate(blocks):
        groups.setdefault(b.shape[1:] if stack else i, []).append(i)
    done: list[Tensor | None] = [None] * len(blocks)
    for members in groups.values():
        if len(members) == 1 and cuts[members[0]] is None:  # a matrix alone: the 2-D products
            done[members[0]] = orthogonalise(grads[members[0]], coefficients, dtype).unsqueeze(0)
            continue
        # (sum n_i, r, c)
        both = blocks[members[0]] if len(members) == 1 else torch.cat([blocks[i] for i in members])
        stacked = orthogonalise(both, coefficients, dtype)
        for i, part in zip(members, stacked.split([blocks[i].size(0) for i in members]),
                           strict=True):
            done[i] = part
    return [(from_blocks(x, cut), b.shape[1:]) for x, cut,
            b in zip(done, cuts, blocks, strict=True)]
