"""Plugin options, typed or plain, checked and built in one place, before anything is built;
and one default for the token budget, stored once."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pytest
from fakes import FakeExecutor, fake_engine

from schedlab import registry
from schedlab.config import DEFAULT_MAX_NUM_BATCHED_TOKENS, ConfigError, EngineConfig
from schedlab.engine import Engine
from schedlab.queue import RequestQueue
from schedlab.request import SamplingParams

EXAMPLES = Path(__file__).parent / "fixtures" / "plugin_examples"
SPF = "spf_queue:ShortestPromptFirstQueue"


@pytest.fixture
def examples(monkeypatch):
    monkeypatch.syspath_prepend(str(EXAMPLES))
    yield
    registry.load.cache_clear()




# ---- typed options ------------------------------------------------------------------------
def test_typed_options_reach_the_plugin_and_it_runs(examples):
    eng = fake_engine(queue=SPF, queue_options={"max_skips": 2}, max_num_seqs=1)
    assert eng.scheduler.waiting.options.max_skips == 2
    lens = [30, 5, 6, 7, 8]
    reqs = [eng.add_request(list(range(2, 2 + n)), SamplingParams(max_tokens=1, ignore_eos=True))
            for n in lens]
    order = []
    while eng.has_unfinished():
        order += [r.num_prompt_tokens for r in eng.step()]
        eng.check_integrity()
    # shortest first, but the 30-token prompt goes once it has been passed over twice
    assert order == [5, 6, 30, 7, 8] and all(r.is_finished for r in reqs)


def test_typed_options_default_when_none_are_given(examples):
    assert fake_engine(queue=SPF).scheduler.waiting.options.max_skips == 8


@pytest.mark.parametrize(("options", "words"), [
    ({"max_skip": 2}, ["has no option 'max_skip'", "max_skips: int = 8",
                       "times a request may be passed over"]),
    ({"max_skips": "two"}, ["option max_skips='two' must be int"]),
    ({"max_skips": True}, ["option max_skips=True must be int"]),
    ({"max_skips": -1}, ["spf_queue:ShortestPromptFirstQueue", "max_skips=-1 must be >= 0"]),
])
def test_typed_options_are_refused_in_one_sentence(examples, options, words):
    with pytest.raises(ConfigError) as e:
        fake_engine(queue=SPF, queue_options=options)
    for w in words:
        assert w in str(e.value), str(e.value)


def test_typed_options_are_a_hydra_structured_config(examples):
    from omegaconf import OmegaConf
    from omegaconf.errors import ValidationError

    cls = registry.load("queue", SPF)
    schema = OmegaConf.structured(cls.Options)
    merged = OmegaConf.merge(schema, {"max_skips": 3})
    assert cls.Options(**OmegaConf.to_container(merged)).max_skips == 3
    with pytest.raises(ValidationError):
        OmegaConf.merge(schema, {"max_skips": "two"})


def test_plugins_check_lists_typed_options_with_help(examples):
    from schedlab.testing import check_plugin

    results = check_plugin("queue", SPF, seeds=(0,))
    assert all(r.ok is not False for r in results), [r.message for r in results]
    (opts,) = [r for r in results if r.check == "options"]
    assert "max_skips: int = 8 (times a request may be passed over" in opts.message


@dataclass(frozen=True)
class _Opts:
    n: int = field(default=1, metadata={"help": "a count"})


class NoOptionsArgument(RequestQueue):
    """Declares typed options but its constructor cannot take them."""

    Options = _Opts

    def __init__(self) -> None:
        super().__init__()

    add = pop = peek = prepend = remove = __len__ = __iter__ = None


def test_a_typed_plugin_must_take_its_options_argument():
    with pytest.raises(registry.PluginError, match="its Options as the keyword `options`"):
        registry.load("queue", NoOptionsArgument)


def test_plain_keyword_plugins_still_list_and_check_their_options():
    specs, open_ = registry.option_specs("queue", registry.load("queue", "vtc"))
    assert not open_ and {"input_weight", "output_weight"} <= {s.name for s in specs}
    with pytest.raises(ConfigError, match="has no option 'bogus'.*input_weight"):
        registry.resolve("queue", "vtc", {"bogus": 1})


def test_every_option_is_checked_before_the_executor_is_built(monkeypatch):
    """A bad scheduler option fails before any model (here: the executor) is built."""
    built = []

    class Recording(FakeExecutor):
        def __init__(self, config, **options):
            built.append(config)
            super().__init__(config, **options)

    with pytest.raises(ConfigError, match="has no option 'nonesuch'"):
        Engine(EngineConfig(model="fake", scheduler="continuous",
                            scheduler_options={"nonesuch": 1}), executor_cls=Recording)
    assert built == []


def test_schedlab_run_checks_plugins_before_building_the_model(monkeypatch, tmp_path):
    """Under `schedlab run`, a broken option is reported before the model is prepared."""
    from schedlab.cli import app
    from schedlab.cli.settings import ModelSource

    prepared = []
    monkeypatch.setattr(ModelSource, "prepare", lambda self: prepared.append(self))
    from hydra import compose, initialize_config_module

    with initialize_config_module(config_module="schedlab.conf", version_base="1.3"):
        cfg = compose("config", overrides=["queue=vtc", "+queue.options.bogus=1",
                                           "logger=none", f"paths.output_dir={tmp_path}"])
    settings = app.build_settings(cfg)
    with pytest.raises(ConfigError, match="has no option 'bogus'"):
        app.execute(settings)
    assert prepared == []


# ---- one default for the token budget ---------------------------------------------------------
def test_the_token_budget_has_one_default_and_is_stored_once():
    chunked = fake_engine(scheduler="chunked_prefill", max_model_len=64)
    assert chunked.max_num_batched_tokens == DEFAULT_MAX_NUM_BATCHED_TOKENS
    assert chunked.scheduler.config is chunked.limits  # one object: engine and scheduler
    whole = fake_engine(scheduler="continuous", max_model_len=64)
    assert whole.limits.max_num_batched_tokens == max(DEFAULT_MAX_NUM_BATCHED_TOKENS, 64)
    set_ = fake_engine(scheduler="continuous", max_model_len=64, max_num_batched_tokens=128)
    assert (set_.max_num_batched_tokens, set_.max_model_len) == (128, 64)
