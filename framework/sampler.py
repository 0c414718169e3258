"""Sampling from the logits of one step: greedy, temperature, top-k, top-p, per-request seeds."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from schedlab.request import Request


def sample(
    logits: torch.Tensor, requests: Sequence[Request], generator: torch.Generator | None = None
) -> list[int]:
    """One token per row of `logits` ([S, V]) for the matching request.

    Greedy rows take the argmax; the others are sampled after temperature, top-k and top-p,
    with the request's own generator when it set a seed (stable across batch composition).
    """
    params = [r.sampling_params for r in requests]
    out = logits.argmax(dim=-1)
    rows = [i for i, p in enumerate(params) if not p.greedy]
    if not rows:
        return out.tolist()
    idx = torch.tensor(rows, device=logits.device)
    x = logits.index_select(0, idx).float()
    temps = torch.tensor([params[i].temperature for i in rows], device=x.device)
    x = x / temps.unsqueeze(1)
    for j, i in enumerate(rows):
        k = params[i].top_k
        if 0 < k < x.shape[1]:
            kth = torch.topk(x[j], k).values[-1]
            x[j] = x[j].masked_fill(x[j] < kth, float("-inf"))
    top_ps = torch.tensor([params[i].top_p for i in rows], device=x.device)
    if bool((top_ps < 1.0).any()):
        x = _top_p(x, top_ps)
    probs = torch.softmax(x, dim=-1)
    picks = out.tolist()
    for j, i in enumerate(rows):
        r = requests[i]
        g = _generator(r, logits.device) or generator
        picks[i] = int(torch.multinomial(probs[j], 1, generator=g).item())
    return picks


def _top_p(x: torch.Tensor, top_ps: torch.Tensor) -> torch.Tensor:
    sorted_x, order = torch.sort(x, dim=-1, descending=True)
    cum = torch.softmax(sorted_x, dim=-1).cumsum(dim=-1)
    # drop a token when the mass before it already reaches top_p (the first token always stays)
    drop = (cum - torch.softmax(sorted_x, dim=-1)) >= top_ps.unsqueeze(1)
    sorted_x = sorted_x.masked_fill(drop, float("-inf"))
    return torch.empty_like(x).scatter_(1, order, sorted_x)


def _generator(r: Request, device: torch.device) -> torch.Generator | None:
    seed = r.sampling_params.seed
    if seed is None:
        return None
    if isinstance(r.generator, torch.Generator):
        return r.generator
    g = torch.Generator(device=device)
    g.manual_seed(seed)
    r.generator = g
    return g
