"""Sampling from the logits of one step: greedy, temperature, top-k, top-p, per-request seeds,
and vLLM's logit shaping (min_tokens, logit_bias, repetition / frequency / presence penalties)."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from schedlab.request import Request, RequestFailure


def sample(
    logits: torch.Tensor, requests: Sequence[Request], generator: torch.Generator | None = None
) -> list[int]:
    """One token per row of `logits` ([S, V]) for the matching request.

    As vLLM's sampler: rows whose request shapes its logits get min_tokens, then logit_bias,
    then the penalties (greedy rows too); greedy rows take the argmax; the others are sampled
    after temperature, top-k and top-p, with the request's own generator when it set a seed
    (stable across batch composition).

    Raises:
        RequestFailure: some rows cannot be sampled (their distribution is not finite, or the
            seed is refused); no random number was drawn, the other rows are fine.
    """
    params = [r.sampling_params for r in requests]
    shaped = [i for i, p in enumerate(params) if p.shapes_logits]
    if shaped:
        logits = logits.float().clone()
        for i in shaped:
            _shape_row(logits[i], requests[i])
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
    failed: dict[str, str] = {}
    # NOTE: a NaN, a +inf or an all -inf row makes softmax NaN across the whole row, so one
    # column tells which rows cannot be sampled
    bad = probs[:, 0].isnan().nonzero().flatten().tolist()
    for j in bad:
        failed[requests[rows[j]].request_id] = "its next-token distribution is not finite"
    gens: list[torch.Generator | None] = []
    for i in rows:
        try:
            gens.append(_generator(requests[i], logits.device) or generator)
        except (RuntimeError, ValueError, OverflowError) as e:
            failed[requests[i].request_id] = f"its seed was refused ({e})"
            gens.append(None)
    if failed:  # NOTE: before any draw, so a retried step samples the others as before
        raise RequestFailure(failed)
    picks = out.tolist()
    for j, i in enumerate(rows):
        picks[i] = int(torch.multinomial(probs[j], 1, generator=gens[j]).item())
    return picks


def _shape_row(x: torch.Tensor, r: Request) -> None:
    """vLLM's logits processors and penalties on one request's row, in place."""
    sp = r.sampling_params
    vocab = x.shape[0]
    out_ids = r.output_token_ids
    if len(out_ids) < sp.min_tokens:
        enders = set(sp.stop_token_ids) | (set() if sp.ignore_eos else set(r.eos_token_ids))
        ends = [t for t in enders if 0 <= t < vocab]
        if ends:
            x[torch.tensor(ends, device=x.device)] = float("-inf")
    if sp.logit_bias:
        pairs = [(t, b) for t, b in sp.logit_bias.items() if 0 <= t < vocab]
        if pairs:
            ids = torch.tensor([t for t, _ in pairs], device=x.device)
            x.index_add_(0, ids, torch.tensor([b for _, b in pairs], device=x.device,
                                              dtype=x.dtype))
    rep, freq, pres = sp.repetition_penalty, sp.frequency_penalty, sp.presence_penalty
    if rep == 1.0 and not freq and not pres:
        return
    counts = (torch.bincount(torch.tensor(out_ids, device=x.device), minlength=vocab)[:vocab]
              .to(x.dtype) if out_ids else torch.zeros_like(x))
    if rep != 1.0:
        seen = torch.zeros(vocab, dtype=torch.bool, device=x.device)
        prompt = [t for t in r.prompt_token_ids if 0 <= t < vocab]
        seen[torch.tensor(prompt, device=x.device, dtype=torch.long)] = True
        seen |= counts > 0
        x.copy_(torch.where(seen, torch.where(x > 0, x / rep, x * rep), x))
    if freq:
        x.sub_(freq * counts)
    if pres:
        x.sub_(pres * (counts > 0).to(x.dtype))


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
