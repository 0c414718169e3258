"""The composed Hydra config -> frozen settings for one run, validated before any work starts."""

from __future__ import annotations

import math
import os
import shutil
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import MissingMandatoryValue

from schedlab import registry
from schedlab.cli.config_keys import ENGINE_KEYS, PLUGIN_GROUP_KEYS, PLUGIN_GROUPS, check_keys
from schedlab.cluster.config import ClusterConfig, cluster_from_config
from schedlab.config import ConfigError, EngineConfig
from schedlab.runs.stall import PLUGIN_TIMEOUT_S
from schedlab.runs.tracking import TrackingConfig


@dataclass(frozen=True, slots=True)
class ModelSource:
    """Where the model comes from: a checkpoint dir, a config-only preset, or a tiny recipe."""

    name: str
    path: str | None = None
    preset: str | None = None
    tiny: tuple[str, str, int] | None = None  # family, size, seed
    cache_dir: str | None = None

    @property
    def engine_model(self) -> str:
        """The string EngineConfig.model gets: a directory or a preset name."""
        if self.path is not None:
            return self.path
        if self.preset is not None:
            return self.preset
        if self.tiny is None:
            raise ConfigError(f"model={self.name} names no path, preset or tiny recipe")
        return str(self._tiny_dir(self.tiny))

    def _tiny_dir(self, tiny: tuple[str, str, int]) -> Path:
        from schedlab.tiny import cache_dir

        family, size, seed = tiny
        root = Path(self.cache_dir).expanduser() if self.cache_dir else cache_dir()
        return root / f"{family}-{size}-s{seed}"

    def prepare(self) -> None:
        """Build the tiny model on first use (atomically, so parallel jobs can share a cache)."""
        if self.tiny is None or self.path is not None or self.preset is not None:
            return
        from schedlab.tiny import build_tiny_model

        family, size, seed = self.tiny
        out = self._tiny_dir(self.tiny)
        if (out / "schedlab_build.json").is_file():
            build_tiny_model(out, family=family, size=size, seed=seed)  # rebuilds if stale
            return
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.with_name(f".{out.name}.tmp{os.getpid()}")
        build_tiny_model(tmp, family=family, size=size, seed=seed, overwrite=True)
        try:
            os.rename(tmp, out)
        except OSError:  # another process got there first
            shutil.rmtree(tmp, ignore_errors=True)


@dataclass(frozen=True, slots=True)
class RunSettings:
    """Everything one `schedlab run` needs, as plain values."""

    engine: EngineConfig
    model: ModelSource
    workload: dict[str, Any]
    tracking: TrackingConfig
    output_dir: Path
    seed: int = 0
    temperature: float = 0.0
    ignore_eos: bool = True
    max_concurrency: int | None = None
    progress: bool = True
    #: keep every request and write the per-request lists (False: stream, summaries only)
    save_detailed: bool = True
    #: processes a simulated cluster's instances run in (`run_workload`'s `workers`)
    workers: int = 1
    #: seconds a plugin call may run before the run stops naming it (None: wait)
    plugin_timeout_s: float | None = PLUGIN_TIMEOUT_S
    percentiles: tuple[float, ...] = (50, 90, 95, 99)
    slo: dict[str, float] | None = None
    plots: bool = True
    print_table: bool = True
    #: N instances behind a router, or prefill/decode disaggregation (None: one engine)
    cluster: ClusterConfig | None = None
    #: the resolved config (what results.json and W&B record)
    config: dict[str, Any] = field(default_factory=dict)


def resolve_config(cfg: DictConfig) -> dict[str, Any]:
    """The composed config as a plain dict with every interpolation resolved.

    Raises:
        ConfigError: a required value (`???`) was not given.
    """
    try:
        container = OmegaConf.to_container(cfg, resolve=True, throw_on_missing=True)
    except MissingMandatoryValue as e:
        key = e.full_key or "a value"
        raise ConfigError(f"{key} is required and was not given; set it on the command line, "
                          f"e.g. {key}=...") from None
    if not isinstance(container, dict):
        raise ConfigError(f"the composed config is a {type(container).__name__}, not a mapping")
    return {str(k): v for k, v in container.items()}


def build_settings(cfg: DictConfig, group: str | None = None,
                   run_name: str | None = None) -> RunSettings:
    """Validate the config and turn it into `RunSettings`. Nothing is built or loaded.

    Args:
        cfg: the composed config.
        group: the W&B group when `logger.group` is null (a sweep's name).
        run_name: the W&B run name when `logger.run_name` is null.

    Raises:
        ConfigError: a value is missing, has the wrong type or is out of range.
        registry.PluginError: a plugin name is not installed (the message lists the installed).
    """
    c = resolve_config(cfg)
    check_keys(c)
    seed = c.get("seed", 0)
    if not _is_int(seed) or seed < 0:
        raise ConfigError(f"seed={seed!r} must be an integer >= 0")
    for kind in PLUGIN_GROUPS:
        node = _mapping(c, kind)
        unknown = sorted(set(node) - set(PLUGIN_GROUP_KEYS))
        if unknown:
            raise ConfigError(f"{kind}.{unknown[0]} is not a key of the {kind} group; accepted: "
                              f"{', '.join(PLUGIN_GROUP_KEYS)} (constructor options go under "
                              f"{kind}.options)")
        if not isinstance(node.get("options") or {}, Mapping):
            raise ConfigError(f"{kind}.options={node.get('options')!r} must be a mapping of "
                              "constructor keyword arguments")
        name = node.get("name")
        if registry.is_dotted(name):
            continue  # a class on a dotted path: imported and checked when the engine is built
        if name not in registry.available(kind):
            installed = ", ".join(registry.available(kind)) or "none installed"
            raise registry.PluginError(f"{kind}.name={name!r} is not an installed {kind} plugin; "
                                       f"installed: {installed}; or name a class as "
                                       f"{kind}=module:Class")
    model = _model_source(c)
    engine_keys = dict(_mapping(c, "engine"))
    plugin_keys: dict[str, Any] = {}
    for kind in PLUGIN_GROUPS:
        node = _mapping(c, kind)
        plugin_keys[kind] = node["name"]
        options = dict(node.get("options") or {})
        plugin_keys[f"{kind}_options"] = options
    unknown = sorted(set(engine_keys) - set(ENGINE_KEYS))
    if unknown:
        raise ConfigError(f"engine.{unknown[0]} is not an engine key; accepted: "
                          f"{', '.join(ENGINE_KEYS)} (plugins are chosen by their own groups: "
                          f"{', '.join(PLUGIN_GROUPS)})")
    try:
        engine = EngineConfig(model=model.engine_model, **plugin_keys, **engine_keys)
    except ConfigError as e:  # name the key as it is spelled on the command line
        msg = str(e)
        key = msg.split("=", 1)[0]
        raise ConfigError(f"engine.{msg}" if key in engine_keys else msg) from None
    if model.preset is not None and model.path is None and engine.executor == "torch":
        raise ConfigError(
            f"model={model.name!r} is a config-only preset (model.preset={model.preset!r}, no "
            "weights) and executor='torch' runs real weights; use executor=sim, or "
            "model=path model.path=<checkpoint dir>")

    sampling, driver, metrics = (_mapping(c, k) for k in ("sampling", "driver", "metrics"))
    max_conc = driver.get("max_concurrency")
    if max_conc is not None and (not _is_int(max_conc) or max_conc < 1):
        raise ConfigError(f"driver.max_concurrency={max_conc!r} must be an integer >= 1 or null")
    save_detailed = _bool(driver, "save_detailed", "driver")
    workers = driver.get("workers", 1)
    if not _is_int(workers) or workers < 1:
        raise ConfigError(f"driver.workers={workers!r} must be an integer >= 1 (the processes a "
                          "simulated cluster's instances run in)")
    timeout = driver.get("plugin_timeout_s", PLUGIN_TIMEOUT_S)
    if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, int | float)
                                or not 0 < timeout < math.inf):
        raise ConfigError(f"driver.plugin_timeout_s={timeout!r} must be a number of seconds > 0 "
                          "(a plugin call running longer stops the run) or null (wait)")
    cluster = cluster_from_config(c.get("cluster"), c.get("router"))
    temperature = sampling.get("temperature", 0.0)
    if isinstance(temperature, bool) or not isinstance(temperature, int | float) or not (
            0 <= temperature < math.inf):
        raise ConfigError(f"sampling.temperature={temperature!r} must be a finite number >= 0")
    pcts = metrics.get("percentiles") or []
    if not isinstance(pcts, list) or not all(
            isinstance(p, int | float) and not isinstance(p, bool) and 0 < p < 100 for p in pcts):
        raise ConfigError(f"metrics.percentiles={pcts!r} must be a list of numbers in (0, 100)")
    output_dir = _mapping(c, "paths").get("output_dir")
    if not output_dir:
        raise ConfigError("paths.output_dir is not set (the run directory)")
    return RunSettings(
        engine=engine,
        model=model,
        workload=dict(_mapping(c, "workload")),
        tracking=_tracking(c, group, run_name),
        output_dir=Path(output_dir),
        seed=seed,
        temperature=float(temperature),
        ignore_eos=_bool(sampling, "ignore_eos", "sampling"),
        max_concurrency=max_conc,
        progress=_bool(driver, "progress", "driver"),
        save_detailed=save_detailed,
        workers=workers,
        plugin_timeout_s=None if timeout is None else float(timeout),
        percentiles=tuple(pcts),
        slo=_slo(metrics.get("slo")),
        plots=_bool(c, "plots"),
        print_table=_bool(c, "print_table"),
        cluster=cluster,
        config=c,
    )


def _slo(value: Any) -> dict[str, float] | None:
    """`metrics.slo`: null, a mapping {ttft: 200, tpot: 50} or a string 'ttft=200,tpot=50' (ms)."""
    from schedlab.runs.metrics import SLO_KEYS, parse_slo

    if value is None:
        return None
    try:
        if isinstance(value, Mapping):
            slo = {str(k): float(v) for k, v in value.items()}
            unknown = sorted(set(slo) - set(SLO_KEYS))
            if unknown or not all(v > 0 for v in slo.values()):
                raise ValueError(f"keys must be among {', '.join(SLO_KEYS)} with positive ms")
            return slo
        return parse_slo(str(value))
    except (TypeError, ValueError) as e:
        raise ConfigError(f"metrics.slo={value!r}: {e}") from None


def _model_source(c: dict[str, Any]) -> ModelSource:
    from schedlab.tiny import FAMILIES, SIZES

    m = _mapping(c, "model")
    name, path, preset, tiny = m.get("name", "model"), m.get("path"), m.get("preset"), m.get("tiny")
    cache = _mapping(c, "paths").get("cache_dir")
    if path is not None:
        p = Path(str(path)).expanduser()
        if not (p / "config.json").is_file():
            raise ConfigError(f"model.path={str(path)!r} is not a checkpoint directory "
                              "(no config.json there)")
        return ModelSource(name, path=str(p))
    if preset is not None:
        return ModelSource(name, preset=str(preset))
    if not isinstance(tiny, Mapping):
        raise ConfigError(f"model={name!r} has no path, preset or tiny recipe; give model.path="
                          "<checkpoint dir> or choose a built-in model (model=llama_tiny)")
    family, size, seed = tiny.get("family"), tiny.get("size"), tiny.get("seed", 0)
    if family not in FAMILIES:
        raise ConfigError(f"model.tiny.family={family!r}; accepted: {', '.join(FAMILIES)}")
    if size not in SIZES:
        raise ConfigError(f"model.tiny.size={size!r}; accepted: {', '.join(SIZES)}")
    if not _is_int(seed):
        raise ConfigError(f"model.tiny.seed={seed!r} must be an integer")
    return ModelSource(name, tiny=(family, size, seed), cache_dir=cache)


def _tracking(c: dict[str, Any], group: str | None, run_name: str | None) -> TrackingConfig:
    lg = c.get("logger") or {"name": "none"}
    tags = lg.get("tags") or []
    if isinstance(tags, str):
        tags = [tags]
    return TrackingConfig(
        backend=str(lg.get("name", "none")),
        project=str(lg.get("project") or "schedlab"),
        entity=lg.get("entity"),
        mode=str(lg.get("mode") or "offline"),
        group=lg.get("group") or group,
        run_name=lg.get("run_name") or run_name,
        tags=tuple(str(t) for t in tags),
        log_steps=_bool(lg, "log_steps", "logger"),
        log_requests=_bool(lg, "log_requests", "logger"),
    )


def _mapping(c: dict[str, Any], key: str) -> dict[str, Any]:
    v = c.get(key)
    if v is None:
        return {}
    if not isinstance(v, Mapping):
        raise ConfigError(f"{key}={v!r} must be a mapping")
    return dict(v)


def _bool(node: Mapping[str, Any], key: str, section: str = "", default: bool = True) -> bool:
    """`node[key]` (at `section.key`), which must be true or false."""
    v = node.get(key, default)
    if not isinstance(v, bool):
        raise ConfigError(f"{section + '.' if section else ''}{key}={v!r}; accepted: true, false")
    return v


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)
