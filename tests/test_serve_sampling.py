"""The sampler's logit shaping as vLLM defines it (min_tokens, logit_bias, repetition /
frequency / presence penalties), and a row that cannot be sampled failing alone."""

from __future__ import annotations

import pytest
import torch

from schedlab.request import Request, RequestFailure, SamplingParams
from schedlab.sampler import sample

V = 32


def _req(rid: str, prompt: list[int], out: list[int], **sp) -> Request:
    r = Request(rid, prompt, SamplingParams(**{"temperature": 0.0, "max_tokens": 50, **sp}),
                eos_token_ids=frozenset({0}))
    r.output_token_ids.extend(out)
    return r


def _vllm_reference(logits: torch.Tensor, r: Request) -> torch.Tensor:
    """vLLM's definitions, token by token: repetition over prompt + output, then frequency
    (per occurrence in the output) and presence (once if in the output)."""
    sp = r.sampling_params
    x = logits.clone()
    for t, b in (sp.logit_bias or {}).items():
        x[t] += max(-100.0, min(100.0, b))
    seen = set(r.prompt_token_ids) | set(r.output_token_ids)
    for t in range(V):
        if t in seen:
            x[t] = x[t] / sp.repetition_penalty if x[t] > 0 else x[t] * sp.repetition_penalty
        n = r.output_token_ids.count(t)
        x[t] -= sp.frequency_penalty * n + sp.presence_penalty * (n > 0)
    return x


@pytest.mark.parametrize("case", range(6))
def test_penalties_and_bias_pick_what_vllm_would(case):
    g = torch.Generator().manual_seed(case)
    logits = torch.randn(3, V, generator=g) * 3
    prompt = torch.randint(0, V, (6,), generator=g).tolist()
    out = torch.randint(0, V, (8,), generator=g).tolist()
    reqs = [
        _req("rep", prompt, out, repetition_penalty=1.3 + case / 5),
        _req("freq", prompt, out, frequency_penalty=0.4 * case / 5 + 0.3,
             presence_penalty=-0.5 + case / 5),
        _req("bias", prompt, out, logit_bias={out[0]: 2.0 + case, 5: -150.0},
             presence_penalty=1.0),
    ]
    picks = sample(logits, reqs)
    for i, r in enumerate(reqs):
        assert picks[i] == int(_vllm_reference(logits[i], r).argmax()), r.request_id
    assert reqs[2].sampling_params.logit_bias[5] == -100.0  # clamped as OpenAI / vLLM


def test_no_shaping_keeps_greedy_and_the_logits_untouched():
    logits = torch.randn(4, V, generator=torch.Generator().manual_seed(1))
    before = logits.clone()
    reqs = [_req(str(i), [1, 2], [3]) for i in range(4)]
    assert sample(logits, reqs) == logits.argmax(-1).tolist()
    assert torch.equal(logits, before)


def test_min_tokens_holds_back_eos_and_stop_ids_until_reached():
    logits = torch.zeros(1, V)
    logits[0, 0] = 10.0  # EOS is the argmax
    logits[0, 7] = 9.0  # then a stop token id
    early = _req("a", [1], [4], min_tokens=3, stop_token_ids=[7])
    pick = sample(logits, [early])[0]
    assert pick not in (0, 7)
    done = _req("b", [1], [4, 5, 6], min_tokens=3, stop_token_ids=[7])
    assert sample(logits, [done]) == [0]
    ignoring = _req("c", [1], [4], min_tokens=3, ignore_eos=True)
    assert sample(logits, [ignoring]) == [0]  # EOS does not end it anyway


def test_a_row_that_cannot_be_sampled_fails_alone_before_any_draw():
    logits = torch.randn(3, V)
    logits[1] = float("nan")
    reqs = [_req("ok", [1], [], temperature=1.0, seed=3),
            _req("bad", [1], [], temperature=1.0),
            _req("greedy", [1], [])]
    with pytest.raises(RequestFailure) as e:
        sample(logits, reqs)
    assert set(e.value.reasons) == {"bad"}
    # the seeded row drew nothing: after the failed request is gone it samples as on its own
    alone = _req("ok2", [1], [], temperature=1.0, seed=3)
    ok_logits = logits[[0, 2]]
    assert sample(ok_logits, [reqs[0], reqs[2]])[0] == sample(ok_logits[:1], [alone])[0]


@pytest.mark.parametrize("field,value", [("seed", 2**64), ("temperature", 1e-45),
                                         ("presence_penalty", 2.5), ("repetition_penalty", 0.0),
                                         ("min_tokens", -1)])
def test_sampling_params_refuse_what_would_break_a_step(field, value):
    with pytest.raises(ValueError, match=field):
        SamplingParams(**{field: value})
