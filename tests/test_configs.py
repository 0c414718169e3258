"""Every YAML of every config group composes, validates and builds, in-process (compose API)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hydra import compose, initialize_config_module
from omegaconf import OmegaConf

from schedlab import registry
from schedlab.cli.settings import build_settings
from schedlab.config import ConfigError

CONF = Path(__file__).resolve().parents[1] / "conf"
#: groups whose options are swapped one at a time over the defaults
GROUPS = ("scheduler", "queue", "kv_allocator", "prefix_cache", "attention", "executor", "model",
          "workload", "logger", "hardware", "experiment")
#: options too large to build in the fast suite (composed and validated all the same)
HEAVY = {("model", "llama_150m")}
#: what a group option needs besides itself to build
EXTRA = {
    ("prefix_cache", "hash_block"): ["kv_allocator=paged"],
    ("prefix_cache", "radix"): ["kv_allocator=paged"],
}


def _options() -> list[tuple[str, str]]:
    out = []
    for group in GROUPS:
        for f in sorted((CONF / group).glob("*.yaml")):
            out.append((group, f.stem))
    return out


OPTIONS = _options()


def _compose(overrides: list[str]):
    with initialize_config_module("schedlab.conf", version_base="1.3"):
        return compose("config", overrides=overrides)


@pytest.fixture(scope="module")
def base_overrides(tmp_path_factory, llama_dir):
    cache = tmp_path_factory.mktemp("tiny-cache")
    out = tmp_path_factory.mktemp("run")
    return [f"paths.cache_dir={cache}", f"paths.output_dir={out}", "logger=none",
            "workload.num_requests=4", "engine.num_kv_blocks=128"]


@pytest.fixture(scope="module")
def traces(tmp_path_factory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("traces")
    sharegpt = [{"conversations": [{"from": "human", "value": "Explain paged attention."},
                                   {"from": "gpt", "value": "Blocks of KV cache, in pages."}]}] * 3
    (d / "sharegpt.json").write_text(json.dumps(sharegpt))
    (d / "azure.csv").write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n"
                                 "2023-11-16 18:15:46.6805900,20,5\n"
                                 "2023-11-16 18:15:47.1805900,12,3\n")
    (d / "burstgpt.csv").write_text("Timestamp,Model,Request tokens,Response tokens\n"
                                    "5,ChatGPT,20,4\n6.5,GPT-4,10,3\n")
    (d / "trace.jsonl").write_text('{"arrival_s": 0, "prompt_tokens": 9, "output_tokens": 3}\n'
                                   '{"arrival_s": 0.1, "prompt": "hello there", '
                                   '"output_tokens": 2}\n')
    from schedlab.sim.hardware import PRESETS

    PRESETS["h100"].save(d / "profile.json")  # for hardware configs that load a profile file
    return {"sharegpt": d / "sharegpt.json", "azure": d / "azure.csv",
            "burstgpt": d / "burstgpt.csv", "jsonl": d / "trace.jsonl",
            "profile": d / "profile.json"}


def _overrides_for(group: str, option: str, base: list[str], llama_dir: str,
                   traces: dict[str, Path]) -> list[str]:
    ov = [*base, f"{group}={option}", *EXTRA.get((group, option), [])]
    if (group, option) == ("model", "path"):
        ov.append(f"model.path={llama_dir}")
    if group == "workload" and option in traces:
        ov.append(f"workload.path={traces[option]}")
    if group == "hardware" or (group == "model" and _yaml(group, option).get("preset")):
        ov.append("executor=sim")
    if group == "hardware" and _yaml(group, option).get("path"):
        ov.append(f"hardware.path={traces['profile']}")
    return ov


def _yaml(group: str, option: str):
    return OmegaConf.load(CONF / group / f"{option}.yaml")


def test_every_plugin_group_has_a_config_for_each_builtin():
    from importlib.metadata import entry_points

    for kind, group in registry.GROUPS.items():
        names = {f.stem for f in (CONF / kind).glob("*.yaml")}
        builtin = {ep.name for ep in entry_points(group=group)
                   if ep.value.startswith("schedlab.")}
        assert builtin <= names, f"conf/{kind}/ lacks {sorted(builtin - names)}"
        for n in names:
            assert OmegaConf.load(CONF / kind / f"{n}.yaml").name == n


def test_experiments_are_global_deltas():
    for f in (CONF / "experiment").glob("*.yaml"):
        assert f.read_text().startswith("# @package _global_"), f.name


def test_root_defaults_put_self_first_and_optional_groups_null():
    root = OmegaConf.load(CONF / "config.yaml")
    defaults = list(root.defaults)
    assert defaults[0] == "_self_"
    choices = {k: v for d in defaults[1:] for k, v in d.items()}
    assert choices["experiment"] is None and choices["hardware"] is None
    assert {*registry.GROUPS, "model", "workload", "logger"} <= set(choices)


@pytest.mark.parametrize(("group", "option"), OPTIONS, ids=[f"{g}={o}" for g, o in OPTIONS])
def test_config_composes_and_builds(group, option, base_overrides, llama_dir, traces):
    cfg = _compose(_overrides_for(group, option, base_overrides, llama_dir, traces))
    settings = build_settings(cfg)
    if group in registry.GROUPS:
        assert getattr(settings.engine, group) == cfg[group].name
    if (group, option) in HEAVY:
        pytest.skip("composed and validated; too large to build in the fast suite")
    for kind in registry.GROUPS:
        try:
            registry.load(kind, getattr(settings.engine, kind))
        except registry.PluginError as e:
            if "failed to load" in str(e):
                pytest.skip(f"plugin not implemented yet: {e}")
            raise
    from schedlab.engine import Engine
    from schedlab.runs.workload import build_workload

    settings.model.prepare()
    try:
        engine = Engine(settings.engine)
    except RuntimeError as e:  # e.g. a CUDA-only backend on this machine
        pytest.skip(f"{group}={option} cannot run here: {e}")
    reqs = build_workload(settings.workload, engine.model_spec.vocab_size, seed=settings.seed)
    assert reqs


def test_bad_values_name_the_key(base_overrides):
    cases = {
        "engine.block_size=3": "engine.block_size=3",
        "engine.max_num_seqs=abc": "engine.max_num_seqs='abc'",
        "scheduler.name=nope": "installed:",
        "model.tiny.size=huge": "model.tiny.size='huge'",
        "driver.max_concurrency=0": "driver.max_concurrency=0",
        "driver.save_detailed=sometimes": "driver.save_detailed='sometimes'",
        "logger=wandb logger.mode=sometimes": "logger.mode='sometimes'",
    }
    for override, expected in cases.items():
        cfg = _compose([*base_overrides, *override.split()])
        with pytest.raises((ConfigError, registry.PluginError), match=expected.replace("(", r"\(")):
            build_settings(cfg)


ADDED_KEYS = {  # a key added with + that nothing reads -> what the sentence must say
    "+workload.arrival.burstines=2": "workload.arrival.burstines is not a key of "
                                     "workload.arrival; accepted: process, rate, burstiness",
    "+driver.max_concurency=2": "driver.max_concurency is not a key of the driver section; "
                                "accepted: max_concurrency, progress, save_detailed, workers, "
                                "plugin_timeout_s",
    "+workload.oracle_output=false": "workload.oracle_output is not a key of a type=synthetic "
                                     "workload; accepted: type, num_requests,",
    "+metrics.foo=1": "metrics.foo is not a key of the metrics section; accepted: percentiles, "
                      "slo",
    "+sampling.foo=1": "sampling.foo is not a key of the sampling section; accepted: "
                       "temperature, ignore_eos",
    "+model.foo=1": "model.foo is not a key of the model section; accepted: name, path, preset, "
                    "tiny",
    "+model.tiny.foo=1": "model.tiny.foo is not a key of the model.tiny section; accepted: "
                         "family, size, seed",
    "+paths.foo=1": "paths.foo is not a key of the paths section; accepted: log_dir,",
    "+logger.foo=1": "logger.foo is not a key of the logger section; accepted: name, project,",
    "+foo=1": "foo is not a key of the config; accepted: seed, plots, print_table, engine,",
    "+engine.scheduler=static": "engine.scheduler is not an engine key; accepted: block_size,",
    "+workload.slo_classes=[{name:chat,deadline:500}]":
        "workload.slo_classes[0].deadline (class 'chat') is not a key of an SLO class; "
        "accepted: name, deadline_ms, weight, priority",
    "+workload.clients=[{id:a,wieght:3}]": "workload.clients[0].wieght (client 'a') is not a "
                                           "key of a client; accepted: id, weight, rate,",
}
NOT_BOOLEAN = ("workload.oracle_output_len", "sampling.ignore_eos", "driver.progress",
               "driver.save_detailed", "plots", "print_table")


@pytest.mark.parametrize("override", list(ADDED_KEYS))
def test_a_key_added_with_plus_that_nothing_reads_is_refused(override, base_overrides):
    cfg = _compose([*base_overrides, override])
    with pytest.raises(ValueError) as e:  # ConfigError, or WorkloadError for the workload
        build_settings(cfg)
    assert str(e.value).startswith(ADDED_KEYS[override]), str(e.value)


@pytest.mark.parametrize("key", NOT_BOOLEAN)
def test_a_switch_takes_true_or_false_only(key, base_overrides):
    cfg = _compose([*base_overrides, f"{key}=maybe"])
    with pytest.raises(ValueError, match=rf"^{key}='maybe'; accepted: true, false$"):
        build_settings(cfg)


def test_seed_and_lengths_refuse_values_numpy_would_choke_on(base_overrides, llama_dir):
    with pytest.raises(ConfigError, match=r"^seed=-1 must be an integer >= 0$"):
        build_settings(_compose([*base_overrides, "seed=-1"]))
    with pytest.raises(ConfigError, match=r"^sampling.temperature=nan must be a finite number"):
        build_settings(_compose([*base_overrides, "sampling.temperature=nan"]))
    from schedlab.runs.workload import build_workload

    settings = build_settings(_compose([*base_overrides, "workload.input_len.max=nan"]))
    with pytest.raises(ValueError, match=r"^workload.input_len.max=nan must be a number"):
        build_workload(settings.workload, 512)


@pytest.mark.parametrize("overrides, want", [
    (["workload.input_len.dist=fixed", "+workload.input_len.value=64"],
     {"dist": "fixed", "min": 16, "max": 384, "value": 64}),
    (["workload.input_len.dist=zipf", "+workload.input_len.alpha=1.2"],
     {"dist": "zipf", "min": 16, "max": 384, "alpha": 1.2}),
    (["experiment=orca", "workload.output_len.dist=uniform"],
     {"dist": "uniform", "min": 1, "max": 384}),
    (["experiment=orca", "workload.output_len={dist:uniform,min:2}"],
     {"dist": "uniform", "min": 2, "max": 384}),
    (["experiment=orca", "workload.output_len.dist=uniform",
      "+workload.output_len.range_ratio=0.5"],
     {"dist": "uniform", "min": 1, "max": 384, "mean": 48, "range_ratio": 0.5}),
])
def test_switching_dist_drops_what_the_config_gave_the_other_dist(overrides, want,
                                                                  base_overrides):
    """`schedlab run` with a length spec's `dist` switched: the bounds every spec carries stay,
    the parameters the config gave the other distribution (orca's lognormal mean and sigma)
    go, so the switch is not refused for keys the user never wrote."""
    from schedlab.cli.checks import drop_carried_keys

    node = "input_len" if "input_len" in overrides[0] else "output_len"
    cfg = _compose([*base_overrides, *drop_carried_keys(overrides)])
    assert OmegaConf.to_container(cfg.workload[node]) == want
    build_settings(cfg)


def test_the_keys_checked_are_those_the_root_config_sets():
    """`accepted_keys` and conf/config.yaml agree: every section key the root config sets is
    accepted, and every accepted one is set there (one default per knob)."""
    from schedlab.cli.config_keys import ENGINE_KEYS, SECTION_KEYS, accepted_keys

    root = OmegaConf.to_container(OmegaConf.load(CONF / "config.yaml"))
    for section in ("engine", "sampling", "driver", "metrics"):
        want = ENGINE_KEYS if section == "engine" else SECTION_KEYS[section]
        assert set(root[section]) == set(want), section
    cfg = _compose([])
    assert set(cfg) <= set(accepted_keys("", cfg))
    for name in ("paths", "logger", "model"):
        assert set(cfg[name]) <= set(accepted_keys(name, cfg[name])), name


EXPERIMENTS = sorted(f.stem for f in (CONF / "experiment").glob("*.yaml"))


@pytest.mark.parametrize("name", EXPERIMENTS)
def test_every_experiment_passes_the_key_checks(name):
    """Each shipped experiment validates, and the keys its sweep overrides exist (the check
    `schedlab run` makes on the command line)."""
    from schedlab.cli.checks import check_override_keys

    with initialize_config_module("schedlab.conf", version_base="1.3"):
        full = compose("config", overrides=[f"experiment={name}"], return_hydra_config=True)
        cfg = compose("config", overrides=[f"experiment={name}", "paths.output_dir=out"])
        params = full.hydra.sweeper.get("params") or {}
        swept = [f"{k}={v}" for k, v in params.items()]
        build_settings(cfg)
        assert check_override_keys([f"experiment={name}", *swept]) is None


def test_model_path_is_required(base_overrides):
    cfg = _compose([*base_overrides, "model=path"])
    with pytest.raises(ConfigError, match="model.path is required"):
        build_settings(cfg)


def test_preset_model_needs_the_sim_executor(base_overrides):
    cfg = _compose([*base_overrides, "model.preset=llama3_8b", "model.tiny=null"])
    with pytest.raises(ConfigError, match="executor=sim"):
        build_settings(cfg)


def test_sim_executor_gets_the_cpu_hardware_preset_by_default(base_overrides, llama_dir):
    from schedlab.engine import Engine

    cfg = _compose([*base_overrides, "executor=sim", "model=path", f"model.path={llama_dir}"])
    engine = Engine(build_settings(cfg).engine)
    hw = engine.executor.hardware
    assert hw.device == "cpu" and hw.name.startswith("cpu-")  # this CPU, probed


def test_slurm_launcher_config_composes():
    with initialize_config_module("schedlab.conf", version_base="1.3"):
        cfg = compose("config", overrides=["hydra/launcher=slurm", "hydra.launcher.partition=gpu"],
                      return_hydra_config=True)
    assert cfg.hydra.launcher._target_.endswith("SlurmLauncher")
    assert cfg.hydra.launcher.partition == "gpu"
