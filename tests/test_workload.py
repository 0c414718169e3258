"""Workload generators and trace loaders: lengths, arrivals, determinism, error messages."""

from __future__ import annotations

import math
import threading
from pathlib import Path

import numpy as np
import pytest

from schedlab.runs.distributions import WorkloadError, random_tokens, sample_lengths
from schedlab.runs.trace_rows import text_to_token_ids
from schedlab.runs.workload import build_workload

DATA = Path(__file__).parent / "data"
VOCAB = 512


def synth(n: int = 200, **kw) -> dict:
    spec = {"type": "synthetic", "num_requests": n, "input_len": 16, "output_len": 8}
    spec.update(kw)
    return spec


# ---- synthetic lengths -----------------------------------------------------------------
def test_fixed_lengths_and_token_range():
    wl = build_workload(synth(50, input_len={"dist": "fixed", "value": 20}, output_len=7), VOCAB)
    assert len(wl) == 50
    assert {len(r.prompt_token_ids) for r in wl} == {20}
    assert {r.max_tokens for r in wl} == {7}
    ids = np.concatenate([r.prompt_token_ids for r in wl])
    assert ids.min() >= 2 and ids.max() < VOCAB  # special ids 0/1 avoided
    assert all(r.arrival_s == 0.0 for r in wl)  # offline by default
    assert all(r.expected_output_len == r.max_tokens for r in wl)


@pytest.mark.parametrize("dist,mean", [
    ({"dist": "uniform", "min": 10, "max": 30}, 20),
    ({"dist": "uniform", "mean": 100, "range_ratio": 0.5}, 100),
    ({"dist": "normal", "mean": 64, "std": 8, "min": 40, "max": 90}, 64),
    ({"dist": "lognormal", "mean": 50, "sigma": 0.5, "min": 1, "max": 10_000}, 50),
])
def test_length_distributions_match_parameters(dist, mean):
    wl = build_workload(synth(4000, input_len=dist), VOCAB, seed=3)
    lens = np.array([len(r.prompt_token_ids) for r in wl])
    assert abs(lens.mean() - mean) / mean < 0.03
    lo = dist.get("min", mean * (1 - dist.get("range_ratio", 1)))
    hi = dist.get("max", mean * (1 + dist.get("range_ratio", 1)))
    assert lens.min() >= lo and lens.max() <= hi


def test_zipf_is_bounded_and_favours_short_lengths():
    wl = build_workload(synth(3000, output_len={"dist": "zipf", "alpha": 1.5, "min": 4,
                                                "max": 64}), VOCAB, seed=1)
    lens = np.array([r.max_tokens for r in wl])
    assert lens.min() >= 4 and lens.max() <= 64
    counts = np.bincount(lens)
    assert counts[4] > counts[5] > counts[8] > counts[30]


def test_normal_clips_to_bounds():
    wl = build_workload(synth(500, input_len={"dist": "normal", "mean": 10, "std": 50, "min": 5,
                                              "max": 12}), VOCAB)
    lens = [len(r.prompt_token_ids) for r in wl]
    assert min(lens) == 5 and max(lens) == 12


# ---- arrivals --------------------------------------------------------------------------
def _gaps(wl) -> np.ndarray:
    return np.diff([r.arrival_s for r in wl])


def test_poisson_arrivals_have_the_requested_rate():
    wl = build_workload(synth(20_000, arrival={"process": "poisson", "rate": 10.0}), VOCAB)
    gaps = _gaps(wl)
    assert wl[0].arrival_s == 0.0 and (gaps >= 0).all()
    assert abs(1 / gaps.mean() - 10.0) < 0.3
    assert abs(gaps.std() / gaps.mean() - 1.0) < 0.05  # exponential: CV 1


@pytest.mark.parametrize("burstiness", [0.25, 4.0])
def test_gamma_burstiness_changes_variability_not_rate(burstiness):
    spec = synth(20_000, arrival={"process": "gamma", "rate": 5.0, "burstiness": burstiness})
    gaps = _gaps(build_workload(spec, VOCAB, seed=7))
    assert abs(1 / gaps.mean() - 5.0) / 5.0 < 0.05
    cv = gaps.std() / gaps.mean()
    assert abs(cv - 1 / np.sqrt(burstiness)) / (1 / np.sqrt(burstiness)) < 0.08


def test_infinite_rate_is_offline():
    wl = build_workload(synth(10, arrival={"process": "poisson", "rate": "inf"}), VOCAB)
    assert all(r.arrival_s == 0.0 for r in wl)


def test_same_seed_same_workload():
    spec = synth(30, input_len={"dist": "uniform", "min": 4, "max": 40},
                 arrival={"process": "gamma", "rate": 3, "burstiness": 0.5})
    a, b = build_workload(spec, VOCAB, seed=11), build_workload(spec, VOCAB, seed=11)
    assert a == b
    assert a != build_workload(spec, VOCAB, seed=12)


def test_synthetic_prompts_read_as_the_seeded_draws_every_time():
    """A synthetic workload keeps where each prompt's draw starts, not its tokens: each read
    gives the ids the seeded generator drew for it, as plain ints, the same every time."""
    spec = synth(40, input_len={"dist": "uniform", "min": 1, "max": 300}, output_len=4)
    wl = build_workload(spec, VOCAB, seed=5)
    rng = np.random.default_rng(5)
    lens = sample_lengths(spec["input_len"], 40, rng, "input_len")
    expect = [random_tokens(rng, int(k), VOCAB) for k in lens]  # offline: in draw order
    got = [list(w.prompt_token_ids) for w in wl]
    assert got == expect and all(type(t) is int for p in got for t in p)
    assert [w.prompt_token_ids for w in wl] == expect  # read again
    assert [len(w.prompt_token_ids) for w in wl] == [len(p) for p in expect]
    assert wl[3].prompt_token_ids[2:5] == expect[3][2:5]
    assert [w.prompt_token_ids.read(own=True) for w in wl] == expect  # ints of their own



def test_a_lazy_prompt_reads_like_its_list_from_any_thread():
    """Read as a list reads (membership, index, reversed, + with a list), and the same from
    threads reading at once (every prompt of a workload shares one replay generator)."""
    spec = synth(8, input_len=3000, output_len=4)
    wl = build_workload(spec, VOCAB, seed=3)
    expect = [list(w.prompt_token_ids) for w in wl]
    p, ids = wl[0].prompt_token_ids, expect[0]
    assert p.index(ids[-1]) == ids.index(ids[-1]) and ids[7] in p
    assert list(reversed(p)) == ids[::-1] and p.count(ids[0]) == ids.count(ids[0])
    assert [1] + p == [1] + ids and p + [1] == ids + [1]
    wrong = []

    def read(k: int) -> None:
        wrong.extend(k for _ in range(60) if list(wl[k].prompt_token_ids) != expect[k])

    threads = [threading.Thread(target=read, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not wrong

# ---- shared prefix ---------------------------------------------------------------------
def test_shared_prefix_groups_share_exactly_the_prefix():
    spec = {"type": "shared_prefix", "num_requests": 40, "num_groups": 4, "prefix_len": 32,
            "input_len": {"dist": "uniform", "min": 8, "max": 16}, "output_len": 4}
    wl = build_workload(spec, VOCAB, seed=5)
    prefixes = {tuple(r.prompt_token_ids[:32]) for r in wl}
    assert len(prefixes) == 4
    for p in prefixes:
        members = [r for r in wl if tuple(r.prompt_token_ids[:32]) == p]
        assert len(members) == 10
    for r in wl:
        assert 32 + 8 <= len(r.prompt_token_ids) <= 32 + 16


# ---- bad specs -------------------------------------------------------------------------
@pytest.mark.parametrize("spec,words", [
    ({"type": "replay", "num_requests": 1}, ["workload.type", "synthetic", "shared_prefix"]),
    (synth(input_len={"dist": "pareto"}), ["workload.input_len.dist", "lognormal", "zipf"]),
    (synth(arrival={"process": "hawkes", "rate": 1}), ["workload.arrival.process", "poisson"]),
    (synth(arrival={"process": "poisson"}), ["workload.arrival.rate"]),
    ({"type": "synthetic", "input_len": 4, "output_len": 4}, ["workload.num_requests"]),
    (synth(input_len={"dist": "uniform", "min": 9, "max": 3}), ["workload.input_len", "min"]),
    ({"type": "trace", "format": "csv", "path": "x"}, ["workload.format", "sharegpt", "azure"]),
    ({"type": "trace", "format": "azure", "path": "/no/such.csv"}, ["not found", "such.csv"]),
])
def test_bad_spec_names_the_key_and_accepted_values(spec, words):
    with pytest.raises(WorkloadError) as e:
        build_workload(spec, VOCAB)
    for w in words:
        assert w in str(e.value)


@pytest.mark.parametrize("spec,words", [
    (synth(oracle_output=False), ["workload.oracle_output is not a key of a type=synthetic",
                                  "accepted: ", "oracle_output_len", "priority_levels"]),
    (synth(num_groups=2), ["workload.num_groups is not a key of a type=synthetic", "input_len"]),
    ({"type": "trace", "format": "sharegpt", "path": "x", "input_len": 8},
     ["workload.input_len is not a key of a type=trace", "max_rows", "time_scale"]),
    (synth(arrival={"process": "gamma", "rate": 2, "burstines": 2}),
     ["workload.arrival.burstines is not a key of workload.arrival",
      "accepted: process, rate, burstiness"]),
    (synth(input_len={"dist": "uniform", "min": 1, "maxx": 9}),
     ["workload.input_len.maxx is not a key", "accepted: dist, min, max"]),
    (synth(slo_classes=[{"name": "chat", "deadline": 500, "weight": 1}]),
     ["workload.slo_classes[0].deadline (class 'chat') is not a key of an SLO class",
      "accepted: name, deadline_ms, weight, priority"]),
    (synth(clients=[{"id": "a", "wieght": 3}]),
     ["workload.clients[0].wieght (client 'a') is not a key of a client",
      "accepted: id, weight, rate, count"]),
    (synth(clients=[{"id": "a", "output_len": {"dist": "fixed", "vaule": 3}}]),
     ["workload.clients[0].output_len.vaule is not a key", "value"]),
    (synth(oracle_output_len="maybe"), ["workload.oracle_output_len='maybe'",
                                        "accepted: true, false"]),
    (synth(input_len={"dist": "uniform", "min": 1, "max": float("nan")}),
     ["workload.input_len.max=nan", "not NaN"]),
    (synth(output_len={"dist": "normal", "mean": float("inf"), "std": 1}),
     ["workload.output_len.mean=inf must be a finite number"]),
    # a client's class that no SLO class defines (its requests ran with no deadline), a class
    # given twice (the last won), weights whose sum overflows (a numpy ValueError)
    (synth(clients=[{"id": "a", "slo_class": "chta"}],
           slo_classes=[{"name": "chat", "deadline_ms": 100}, {"name": "batch"}]),
     ["workload.clients[0].slo_class='chta' (client 'a') is not a class of "
      "workload.slo_classes; accepted: chat, batch"]),
    (synth(slo_classes=[{"name": "chat", "deadline_ms": 100}, {"name": "chat"}]),
     ["workload.slo_classes: class names must be unique"]),
    (synth(clients=[{"id": "a", "weight": 1e308}, {"id": "b", "weight": 1e308}]),
     ["workload.clients: the weights (or rates) add up to more than a float holds"]),
    (synth(slo_classes=[{"name": "a", "weight": 1e308}, {"name": "b", "weight": 1e308}]),
     ["workload.slo_classes: the weights add up to more than a float holds"]),
    (synth(clients=[{"id": "a", "priority": 2**60}]),
     ["workload.clients[0].priority=1152921504606846976 must be an integer within +-2**53"]),
    # a key of another distribution: ignored before (alpha under uniform drew uniform lengths)
    (synth(input_len={"dist": "uniform", "min": 1, "max": 9, "alpha": 2}),
     ["workload.input_len.alpha is not read by a dist=uniform length spec; accepted: dist, min, "
      "max, mean, range_ratio"]),
    (synth(output_len={"dist": "zipf", "min": 1, "max": 9, "alpha": 1, "std": 3}),
     ["workload.output_len.std is not read by a dist=zipf", "accepted: dist, min, max, alpha"]),
    (synth(input_len={"dist": "uniform", "min": 1, "max": 9, "mean": 5}),
     ["workload.input_len.mean is not read by a dist=uniform length spec without range_ratio"]),
    (synth(clients=[{"id": "a", "output_len": {"dist": "normal", "mean": 8, "alpha": 1}}]),
     ["workload.clients[0].output_len.alpha is not read by a dist=normal", "std"]),
    ({"type": "sessions", "num_sessions": 2, "input_len": 4, "output_len": 4,
      "think_time_s": {"dist": "uniform", "mean": 1.0, "max": 2}},
     ["workload.think_time_s.mean is not read by a dist=uniform duration spec; accepted: dist, "
      "min, max"]),
])
def test_unknown_keys_and_bad_values_are_named_with_what_is_accepted(spec, words):
    """A misspelled key (the spec's, a nested node's, a list entry's) is refused, not ignored;
    so are a non-boolean switch and NaN (which used to end in a numpy ValueError)."""
    with pytest.raises(WorkloadError) as e:
        build_workload(spec, VOCAB)
    for w in words:
        assert w in str(e.value), str(e.value)


def test_a_parameter_of_another_distribution_is_refused_when_drawn():
    rng = np.random.default_rng(0)
    with pytest.raises(WorkloadError, match="turns.sigma is not read by a dist=fixed"):
        sample_lengths({"dist": "fixed", "value": 3, "sigma": 1}, 4, rng, "turns")
    lens = sample_lengths({"dist": "fixed", "value": 3, "min": 1, "max": 9}, 4, rng, "turns")
    assert lens.tolist() == [3] * 4  # the bounds conf/workload gives every spec are taken


def test_every_shipped_workload_config_passes_the_key_check():
    from omegaconf import OmegaConf

    from schedlab.runs.workload import check_spec

    for f in sorted((Path(__file__).resolve().parents[1] / "conf" / "workload").glob("*.yaml")):
        spec = OmegaConf.to_container(OmegaConf.load(f))
        check_spec(spec)  # no interpolation resolved: only the keys and switches matter


# ---- trace files -----------------------------------------------------------------------
def trace(fmt: str, name: str, **kw) -> dict:
    return {"type": "trace", "format": fmt, "path": str(DATA / name), **kw}


def test_sharegpt_uses_first_two_turns_and_skips_unanswered():
    wl = build_workload(trace("sharegpt", "sharegpt_sample.json"), VOCAB)
    assert len(wl) == 3  # the entry with one turn is skipped
    assert wl[0].prompt_token_ids == text_to_token_ids("What is paged attention?", VOCAB)
    reply = "Requests join and leave the batch at every step."
    assert wl[1].max_tokens == len(text_to_token_ids(reply, VOCAB))
    assert all(r.arrival_s == 0.0 for r in wl)
    online = build_workload(trace("sharegpt", "sharegpt_sample.json",
                                  arrival={"process": "poisson", "rate": 2.0}), VOCAB)
    assert online[0].arrival_s == 0.0 and online[-1].arrival_s > 0


def test_text_tokens_are_deterministic_and_in_range():
    ids = text_to_token_ids("Paged attention, again!", 100)
    assert ids == text_to_token_ids("Paged attention, again!", 100)
    assert all(2 <= t < 100 for t in ids) and len(ids) >= 4


def test_azure_trace_times_and_lengths():
    wl = build_workload(trace("azure", "azure_sample.csv", time_scale=2.0), VOCAB)
    # the row with 0 generated tokens cannot run and is skipped
    assert [len(r.prompt_token_ids) for r in wl] == [374, 396, 91, 381]
    assert [r.max_tokens for r in wl] == [44, 109, 12, 27]
    assert [r.arrival_s for r in wl] == pytest.approx([0.0, 1.0, 4.0, 8.0])


def test_burstgpt_trace_skips_failures_and_filters_model():
    wl = build_workload(trace("burstgpt", "burstgpt_sample.csv"), VOCAB)
    assert [r.max_tokens for r in wl] == [18, 276, 33, 140]
    assert [r.arrival_s for r in wl] == pytest.approx([0.0, 41.0, 45.0, 56.5])
    gpt4 = build_workload(trace("burstgpt", "burstgpt_sample.csv", model="GPT-4"), VOCAB)
    assert [len(r.prompt_token_ids) for r in gpt4] == [417, 96]
    assert gpt4[0].arrival_s == 0.0


def test_jsonl_trace_counts_ids_and_text():
    wl = build_workload(trace("jsonl", "requests_sample.jsonl"), VOCAB)
    assert [len(r.prompt_token_ids) for r in wl[:2]] == [12, 5]
    assert wl[1].prompt_token_ids == [2, 3, 4, 5, 6]
    assert wl[2].prompt_token_ids == text_to_token_ids(
        "The quick brown fox jumps over the lazy dog.", VOCAB)
    assert [r.max_tokens for r in wl] == [5, 3, 7]
    assert [r.arrival_s for r in wl] == [0.0, 0.25, 1.0]
    assert [r.priority for r in wl] == [0, 2, 0]


def test_priority_levels():
    wl = build_workload(synth(300, priority_levels=3), VOCAB)
    assert {r.priority for r in wl} == {0, 1, 2}
    assert {r.priority for r in build_workload(synth(10), VOCAB)} == {0}


def test_trace_row_limits_and_output_override():
    wl = build_workload(trace("azure", "azure_sample.csv", max_rows=2), VOCAB)
    assert len(wl) == 2
    wl = build_workload(trace("burstgpt", "burstgpt_sample.csv", num_requests=3,
                              output_len=16), VOCAB)
    assert [r.max_tokens for r in wl] == [16, 16, 16]
    offline = build_workload(trace("azure", "azure_sample.csv", arrival={"process": "offline"}),
                             VOCAB)
    assert all(r.arrival_s == 0.0 for r in offline)


@pytest.mark.parametrize("fmt,name,text,line,words", [
    ("azure", "bad.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n"
     "2023-11-16 18:15:46.68,374,44\n2023-11-16 18:15:47.18,lots,9\n", 3, ["ContextTokens"]),
    ("azure", "bad.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n"
     "2023-11-16 18:15:46.68,374,44\nyesterday,1,9\n", 3, ["TIMESTAMP", "timestamp"]),
    ("azure", "bad.csv", "TIMESTAMP,ContextTokens\n2023-11-16 18:15:46.68,374\n", 1,
     ["GeneratedTokens"]),
    ("burstgpt", "bad.csv", "Timestamp,Model,Request tokens,Response tokens\n"
     "1,ChatGPT,10,5\n2,ChatGPT,10\n", 3, ["fields"]),
    ("jsonl", "bad.jsonl", '{"prompt_tokens": 3, "output_tokens": 2}\n{"prompt_tokens": 3,\n',
     2, ["invalid JSON"]),
    ("jsonl", "bad.jsonl", '{"prompt_tokens": 3, "output_tokens": 2}\n\n'
     '{"prompt_tokens": 3}\n', 3, ["output_tokens"]),
    ("jsonl", "bad.jsonl", '{"prompt_tokens": [1, 99999], "output_tokens": 2}\n', 1,
     ["prompt_tokens"]),
    ("jsonl", "bad.jsonl", '{"prompt_tokens": 3, "output_tokens": 2, "note": "kept out"}\n'
     '{"prompt_tokens": 3, "output_tokens": 2, "priorty": 1}\n', 2,
     ["'priorty' is not a field of a JSONL trace row (did you mean 'priority'?)"]),
    ("sharegpt", "bad.json", '[\n  {"conversations": [{"from": "human", "value": "hi"},\n'
     '    {"from": "gpt", "value": "yo"}]},\n  {"id": "no-conv"}\n]\n', 4, ["conversations"]),
    ("sharegpt", "bad.json", '[\n  {"conversations": []},\n  {"conversations": [}\n]\n', 3,
     ["invalid JSON"]),
], ids=["azure-count", "azure-timestamp", "azure-column", "burstgpt-fields", "jsonl-json",
        "jsonl-output", "jsonl-ids", "jsonl-misspelt-field", "sharegpt-entry", "sharegpt-json"])
def test_malformed_trace_names_file_and_line(tmp_path, fmt, name, text, line, words):
    p = tmp_path / name
    p.write_text(text)
    with pytest.raises(WorkloadError) as e:
        build_workload({"type": "trace", "format": fmt, "path": str(p)}, VOCAB)
    msg = str(e.value)
    assert name in msg and f"line {line}" in msg, msg
    for w in words:
        assert w in msg, msg


AZURE_HEAD = "TIMESTAMP,ContextTokens,GeneratedTokens\n"
ROW = '{"prompt_tokens": 3, "output_tokens": 2}\n'


@pytest.mark.parametrize("fmt,name,text,line,words", [
    ("azure", "t.csv", AZURE_HEAD + "1e308,10,5\n-1e308,10,5\n", 3, ["TIMESTAMP", ">= 0"]),
    ("azure", "t.csv", AZURE_HEAD + "0,10,5\n1e308,10,5\n", 3, ["TIMESTAMP", "line 2", "1e+09 s"]),
    ("burstgpt", "t.csv", "Timestamp,Model,Request tokens,Response tokens\n"
     "0,ChatGPT,10,5\n2e9,ChatGPT,10,5\n", 3, ["Timestamp", "2e+09 s"]),
    ("jsonl", "t.jsonl", '{"prompt_tokens": 3, "output_tokens": 2, "arrival_s": 1e308}\n'
     '{"prompt_tokens": 3, "output_tokens": 2, "arrival_s": 0}\n', 1, ["arrival_s", "1e+09 s"]),
    ("jsonl", "t.jsonl", '{"prompt_tokens": 3, "output_tokens": 2, "arrival_s": 1' + "0" * 400
     + "}\n", 1, ["arrival_s", "finite"]),
    ("jsonl", "t.jsonl", ROW + '{"prompt_tokens": 10000000000000, "output_tokens": 5}\n', 2,
     ["prompt_tokens", "10,000,000 tokens"]),
    ("jsonl", "t.jsonl", '{"prompt_tokens": 3, "output_tokens": 10000000000000}\n', 1,
     ["output_tokens", "10,000,000 tokens"]),
    ("azure", "t.csv", AZURE_HEAD + "0,1e13,5\n", 2, ["ContextTokens", "10,000,000 tokens"]),
    ("jsonl", "t.jsonl", ROW + "[" * 100_000 + "\n", 2, ["invalid JSON", "nested too deeply"]),
    ("sharegpt", "t.json", "[\n" + "[" * 100_000 + "\n", 2, ["nested too deeply"]),
    ("jsonl", "t.jsonl", '{"prompt_tokens": 3, "output_tokens": ' + "9" * 5000 + "}\n", 1,
     ["invalid JSON", "4300 digits"]),
    ("azure", "t.csv", AZURE_HEAD + "0,10,5\n1,10," + "5" * 140_000 + "\n", 3,
     ["not readable as CSV", "field limit"]),
    # a number that overflows to inf, or past what a float holds exactly (read as is before)
    ("azure", "t.csv", AZURE_HEAD[:-1] + ",deadline_ms\n0,10,5,100\n1,10,5,1e400\n", 3,
     ["deadline_ms='1e400' must be a finite positive number"]),
    ("azure", "t.csv", AZURE_HEAD[:-1] + ",deadline_ms\n0,10,5,inf\n", 2, ["deadline_ms='inf'"]),
    ("azure", "t.csv", AZURE_HEAD[:-1] + ",priority\n0,10,5,1" + "0" * 400 + "\n", 2,
     ["priority of 401 digits is beyond +-2**53"]),
    ("jsonl", "t.jsonl", ROW + '{"prompt_tokens": 3, "output_tokens": 2, "priority": '
     '-9007199254740993}\n', 2, ["priority=-9007199254740993 is beyond +-2**53"]),
    ("jsonl", "t.jsonl", '{"prompt_tokens": 3, "output_tokens": 2, "deadline_ms": 1e400}\n', 1,
     ["deadline_ms=inf must be a finite positive number"]),
    ("azure", "t.csv", AZURE_HEAD + "0,10,5\n1e400,10,5\n", 3, ["TIMESTAMP='1e400'"]),
    ("azure", "t.csv", AZURE_HEAD + "0,1e400,5\n", 2, ["ContextTokens='1e400'"]),
], ids=["azure-negative-time", "azure-time-span", "burstgpt-time-span", "jsonl-time-span",
        "jsonl-time-overflow", "jsonl-prompt-count", "jsonl-output-count", "azure-prompt-count",
        "jsonl-nesting", "sharegpt-nesting", "jsonl-long-int", "csv-long-field",
        "csv-deadline-overflow", "csv-deadline-inf", "csv-priority-overflow",
        "jsonl-priority-beyond-float", "jsonl-deadline-overflow", "csv-time-overflow",
        "csv-count-overflow"])
def test_out_of_bounds_trace_row_names_file_and_line(tmp_path, fmt, name, text, line, words):
    """Rows a reader could parse but no run could replay (an arrival ~1e308 s away, 1e13
    prompt tokens, JSON nested past the parser's depth, a CSV field over its limit) are refused
    with the file and line, not a MemoryError, RecursionError or a run that never ends."""
    p = tmp_path / name
    p.write_text(text)
    with pytest.raises(WorkloadError) as e:
        build_workload({"type": "trace", "format": fmt, "path": str(p)}, VOCAB)
    msg = str(e.value)
    assert msg.startswith(f"{name} line {line}: "), msg
    for w in words:
        assert w in msg, msg


def test_schedlab_run_refuses_an_out_of_bounds_timestamp_in_one_line(tmp_path, capsys):
    """It used to run with an infinite arrival and end in a RuntimeError blaming a plugin."""
    from schedlab.cli import main

    p = tmp_path / "x.csv"
    p.write_text(AZURE_HEAD + "0,10,5\n1e308,10,5\n")
    rc = main(["run", "executor=sim", "model=llama3_8b", "hardware=h100", "workload=azure",
               f"workload.path={p}", "logger=none", "plots=false", "print_table=false",
               "driver.progress=false", f"hydra.run.dir={tmp_path / 'run'}"])
    err = capsys.readouterr().err
    assert rc == 2
    assert err.startswith("schedlab: error: x.csv line 3: TIMESTAMP: ") and err.count("\n") == 1


def test_time_scale_must_be_finite_and_keep_the_trace_in_bounds():
    with pytest.raises(WorkloadError, match="time_scale=inf must be a finite number"):
        build_workload(trace("azure", "azure_sample.csv", time_scale=math.inf), VOCAB)
    with pytest.raises(WorkloadError, match=r"azure_sample.csv line \d+: TIMESTAMP: .* at "
                                            r"time_scale=1e\+300"):
        build_workload(trace("azure", "azure_sample.csv", time_scale=1e300), VOCAB)


def test_lengths_below_one_token_are_refused():
    for spec in ({"input_len": -5, "output_len": 4}, {"input_len": 8, "output_len": 0},
                 {"input_len": {"dist": "fixed", "value": 0}, "output_len": 4}):
        with pytest.raises(WorkloadError, match="must be (within|at least 1)"):
            build_workload({"type": "synthetic", "num_requests": 3, **spec}, 512)


def test_trace_that_is_not_utf8_or_has_a_bom(tmp_path):
    bad = tmp_path / "latin.jsonl"
    bad.write_bytes(b'\xff\xfe garbage\n')
    with pytest.raises(WorkloadError, match="latin.jsonl: not UTF-8 text"):
        build_workload({"type": "trace", "format": "jsonl", "path": str(bad)}, 512)
    for sessions in (False, True):  # NOTE: the sessions reader is another path to the bytes
        with pytest.raises(WorkloadError, match="latin.jsonl: not UTF-8 text"):
            build_workload({"type": "trace", "format": "sharegpt", "path": str(bad),
                            "sessions": sessions}, 512)
    bom = tmp_path / "azure.csv"
    bom.write_text("\ufeffTIMESTAMP,ContextTokens,GeneratedTokens\n0.0,12,5\n1.5,20,3\n",
                   encoding="utf-8")
    reqs = build_workload({"type": "trace", "format": "azure", "path": str(bom)}, 512)
    assert [len(r.prompt_token_ids) for r in reqs] == [12, 20]
    assert [r.arrival_s for r in reqs] == [0.0, 1.5]


# ---- tenants and SLO tiers -------------------------------------------------------------
def test_clients_with_rates_send_their_own_streams():
    spec = {"type": "synthetic", "num_requests": 400, "input_len": 8, "output_len": 4,
            "arrival": {"process": "poisson", "rate": 1.0},
            "clients": [{"id": "heavy", "rate": 6.0, "priority": 1},
                        {"id": "light", "count": 2, "rate": 1.0, "output_len": 2}]}
    w = build_workload(spec, 100, seed=0)
    ids = [r.client_id for r in w]
    assert (ids.count("heavy"), ids.count("light0"), ids.count("light1")) == (300, 50, 50)
    assert [r.arrival_s for r in w] == sorted(r.arrival_s for r in w)
    # each client spans about num_requests_of_client / rate = 50 s
    for cid in ("heavy", "light0", "light1"):
        assert 35 < max(r.arrival_s for r in w if r.client_id == cid) < 65
    assert {r.max_tokens for r in w if r.client_id != "heavy"} == {2}
    assert {r.priority for r in w if r.client_id == "heavy"} == {1}


def test_client_weights_and_slo_classes():
    spec = {"type": "synthetic", "num_requests": 300, "input_len": 8, "output_len": 4,
            "clients": [{"id": "a", "weight": 2}, {"id": "b", "slo_class": "batch"}],
            "slo_classes": [{"name": "chat", "deadline_ms": 500, "priority": 0},
                            {"name": "batch", "deadline_ms": 20000, "priority": 3}]}
    w = build_workload(spec, 100, seed=0)
    assert sum(r.client_id == "a" for r in w) == 200
    assert {(r.slo_class, r.deadline_ms, r.priority) for r in w if r.client_id == "b"} == {
        ("batch", 20000.0, 3)}
    classes = {r.slo_class for r in w if r.client_id == "a"}
    assert classes == {"chat", "batch"}
    with pytest.raises(WorkloadError, match="rate"):
        build_workload({**spec, "clients": [{"id": "a", "rate": 1}, {"id": "b"}]}, 100)
    with pytest.raises(WorkloadError, match="unique"):
        build_workload({**spec, "clients": [{"id": "a"}, {"id": "a"}]}, 100)
    with pytest.raises(WorkloadError, match="slo_classes"):
        build_workload({**spec, "slo_classes": {"chat": 1}}, 100)


def test_trace_rows_carry_tenant_columns(tmp_path):
    jl = tmp_path / "t.jsonl"
    jl.write_text('{"prompt_tokens": 5, "output_tokens": 3, "client_id": "acme", '
                  '"slo_class": "chat"}\n{"prompt_tokens": 5, "output_tokens": 3, '
                  '"deadline_ms": 250, "priority": 2}\n')
    w = build_workload({"type": "trace", "format": "jsonl", "path": str(jl),
                        "slo_classes": [{"name": "chat", "deadline_ms": 900}]}, 100)
    assert [(r.client_id, r.slo_class, r.deadline_ms, r.priority) for r in w] == [
        ("acme", "chat", 900.0, 0), (None, "chat", 250.0, 2)]
    csvf = tmp_path / "a.csv"
    csvf.write_text("TIMESTAMP,ContextTokens,GeneratedTokens,client_id,deadline_ms\n"
                    "0,10,4,u1,300\n1,10,4,,\n")
    w = build_workload({"type": "trace", "format": "azure", "path": str(csvf)}, 100)
    assert [(r.client_id, r.deadline_ms) for r in w] == [("u1", 300.0), (None, None)]


def test_synthetic_prompts_read_out_of_order_or_across_blocks_as_drawn():
    """Prompts are drawn a block at a time (one draw of `BLOCK_TOKENS` or so, the last block
    kept): read out of order, in order, or twice, each is its own seeded draw; the
    generator then stands where the prompt-by-prompt draws leave it (the arrivals and
    everything drawn after are unchanged)."""
    from schedlab.intake import InRangeIds
    from schedlab.runs.prompts import BLOCK_TOKENS, lazy_prompts

    lens = [0, 1, BLOCK_TOKENS + 5, 7, 3, BLOCK_TOKENS - 10, 20, 0, 400] * 12
    rng = np.random.default_rng(9)
    rng.integers(0, 10, size=1, dtype=np.int32)  # a buffered half-draw on the stream
    expect_rng = np.random.default_rng(9)
    expect_rng.integers(0, 10, size=1, dtype=np.int32)
    expect = [random_tokens(expect_rng, k, VOCAB) for k in lens]
    got = lazy_prompts(rng, lens, VOCAB)
    assert rng.bit_generator.state == expect_rng.bit_generator.state
    order = np.random.default_rng(1).permutation(len(lens)).tolist()
    assert [list(got[k]) for k in order] == [expect[k] for k in order]
    assert [list(p) for p in got] == expect and [list(p) for p in got[::-1]] == expect[::-1]
    for own in (True, False):
        ids = got[2].read(own=own)
        assert type(ids) is InRangeIds and ids == expect[2] and ids.bound == VOCAB


def test_synthetic_prompts_read_ahead_in_order_with_jumps_back_and_forth_as_drawn():
    """Reading in order draws `READ_AHEAD_TOKENS` or so at a time from where the last draw
    ended; reads that jump back, forward, skip a block's first prompt or alternate own and
    shared ints still give each prompt its own seeded draw."""
    from schedlab.runs.prompts import READ_AHEAD_TOKENS, lazy_prompts

    r = np.random.default_rng(3)
    lens = r.integers(0, 600, size=3 * READ_AHEAD_TOKENS // 300).tolist()
    lens[5], lens[50:53], lens[70] = 0, [0, 0, 0], 3000
    rng, expect_rng = np.random.default_rng(4), np.random.default_rng(4)
    expect = [random_tokens(expect_rng, k, VOCAB) for k in lens]
    got = lazy_prompts(rng, lens, VOCAB)
    order = list(range(len(lens)))
    for i in range(0, len(order) - 10, 37):
        order[i], order[i + 7] = order[i + 7], order[i]
    order += order[:60] + order[::-1]
    for n, k in enumerate(order):
        assert got[k].read(own=n % 3 > 0) == expect[k], k
