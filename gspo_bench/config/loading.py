"""Config files and flags -> ``RunConfig``: YAML reading, presets, baselines, merging, ``--set``, flattening.

Order of precedence, lowest first: the dataclass defaults, the preset YAML,
each ``--config`` file, ``--set`` overrides, dedicated CLI flags.
"""

from __future__ import annotations

import copy
import dataclasses
import re
from dataclasses import fields
from pathlib import Path
from typing import Any, Union

import yaml

from gspo_bench.config.sections import (CollapseConfig, ConfigError, EnvConfig, LossConfig, ModelConfig, MoEConfig,
                                        RolloutConfig, RunConfig, TaskOptions, TrackingConfig, TrainConfig,
                                        WarmStartConfig, _choice)

PRESET_DIR = Path(__file__).resolve().parent.parent / "presets"


class _Loader(yaml.SafeLoader):
    """YAML as a user means it, one rule for ``--config`` files and ``--set`` values alike: numbers without the
    underscores YAML 1.1 reads into them, so ``0.5_2`` (a rejection band) stays a string where YAML 1.1 makes it
    0.52; ``3e-4`` (no dot) a float, where YAML 1.1 makes it a string; bools only ``true``/``false``, where YAML
    1.1 also reads yes/no/on/off."""


_TAGS = {"tag:yaml.org,2002:bool", "tag:yaml.org,2002:int", "tag:yaml.org,2002:float"}
_Loader.yaml_implicit_resolvers = {
    first: [(tag, rx) for tag, rx in resolvers if tag not in _TAGS]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()}
_Loader.add_implicit_resolver("tag:yaml.org,2002:bool", re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"),
                              list("tTfF"))
_Loader.add_implicit_resolver("tag:yaml.org,2002:int", re.compile(r"^[-+]?(?:0|[1-9][0-9]*)$"),
                              list("-+0123456789"))
_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9]+\.[0-9]*|\.[0-9]+)(?:[eE][-+]?[0-9]+)?$|^[-+]?[0-9]+[eE][-+]?[0-9]+$"
               r"|^[-+]?\.(?:inf|Inf|INF)$|^\.(?:nan|NaN|NAN)$"),
    list("-+0123456789."))


def load_yaml(text: str):
    return yaml.load(text, Loader=_Loader)


def yaml_file(path: str | Path):
    """A YAML file's content; an unreadable file, text that is not UTF-8, or YAML that does not parse (a
    ``!!python/object`` tag included: the loader is safe and refuses it) is a one-line ConfigError."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise ConfigError(f"{path}: not UTF-8 text") from None
    except OSError as e:
        raise ConfigError(f"{path}: {e.strerror or e}") from None
    try:
        return load_yaml(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(e, "problem", None) or (str(e).splitlines() or ["?"])[0]
        raise ConfigError(f"{path}: not valid YAML{at}: {problem}") from None


def _build(cls, data: dict, where: str):
    """Instantiate dataclass ``cls`` from a (partial) dict, recursing into sections."""
    if not isinstance(data, dict):
        raise ConfigError(f"{where or 'config'} must be a mapping, got {type(data).__name__}")
    known = _field_types(cls)
    unknown = set(data) - set(known)
    if unknown:
        raise ConfigError(f"unknown key(s) {sorted(unknown)} in {where or 'config'} (allowed: {', '.join(known)})")
    own = {f.name for f in fields(cls)}
    spread = next((f.name for f in fields(cls) if f.metadata.get("spread")), None)
    kwargs = {}
    for name, value in data.items():
        sub = _section_type(cls, name)
        key = f"{where}.{name}".strip(".")
        if name not in own:  # a loss parameter: gathered in the section's SPREAD field
            kwargs.setdefault(spread, {})[name] = value
        else:
            kwargs[name] = _build(sub, value, key) if sub else value
    try:
        built = cls(**kwargs)
    except TypeError as e:
        raise ConfigError(f"{where or 'config'}: {e}") from None
    # one type rule for a file and --set (after the section's own checks, whose lines say more of a bad value):
    # a bool is true/false, never 1, which a check by value lets through and which would digest apart from true
    for name, value in data.items():
        if not _section_type(cls, name) and not _type_ok(value, known[name]):
            raise ConfigError(_wrong_type(f"{where}.{name}".strip("."), value, known[name]))
    return built


def _section_type(cls, name: str):
    hints = {"model": ModelConfig, "warmstart": WarmStartConfig, "rollout": RolloutConfig, "loss": LossConfig,
             "train": TrainConfig, "collapse": CollapseConfig, "moe": MoEConfig, "tracking": TrackingConfig,
             "env": EnvConfig, "task_options": TaskOptions}
    return hints.get(name) if cls is RunConfig else None


def deep_merge(base: dict, over: dict) -> dict:
    out = dict(base)
    for k, v in over.items():
        out[k] = deep_merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def presets() -> dict[str, Path]:
    return {p.stem: p for p in sorted(PRESET_DIR.glob("*.yaml"))}


def resolve_config_file(path: str | Path) -> Path:
    """A YAML path, or the name of a shipped baseline (``gspo`` or ``baselines/gspo.yaml``)."""
    from gspo_bench.paths import builtin_dir

    p = Path(path).expanduser()
    if p.is_file():
        return p
    shipped = builtin_dir("baselines") / (Path(path).stem + ".yaml")
    if Path(path).parent in (Path("."), Path("baselines")) and shipped.is_file():
        return shipped
    known = ", ".join(sorted(q.stem for q in builtin_dir("baselines").glob("*.yaml")))
    raise ConfigError(f"config file {str(path)!r} does not exist (shipped baselines: {known})")


def read_yaml(path: str | Path) -> dict:
    p = resolve_config_file(path)
    data = yaml_file(p) or {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: top level must be a mapping")
    return data


def load_config(preset: str = "default", config_files: tuple = (), overrides: dict | None = None) -> RunConfig:
    """Dataclass defaults <- preset YAML <- each --config file <- CLI overrides."""
    known = presets()
    _choice("preset", preset, list(known))
    data = deep_merge(read_yaml(known[preset]), {"preset": preset})
    for f in config_files:
        data = deep_merge(data, read_yaml(f))
    data = deep_merge(data, overrides or {})
    # a baseline file names one algorithm; accept the singular for readability
    if "algo" in data:
        data["algos"] = [data.pop("algo")]
    return _build(RunConfig, data, "")


def _field_types(cls) -> dict[str, Any]:
    """The keys a section takes and the annotation each value must fit; a SPREAD field (the loss section's
    parameters) stands for its keys, in its place."""
    from typing import get_type_hints

    hints = get_type_hints(cls)
    out: dict[str, Any] = {}
    for f in fields(cls):
        if f.metadata.get("spread"):
            out.update(cls.param_types())
        else:
            out[f.name] = hints[f.name]
    return out


def _is_union(tp) -> bool:
    import types
    from typing import get_origin

    return get_origin(tp) in (Union, types.UnionType)  # Union[a, b] and a | b


def _type_ok(value, tp) -> bool:
    """``value`` (as YAML read it) fits annotation ``tp``; an int fits float, a bool fits neither int nor float."""
    from typing import get_args, get_origin

    if _is_union(tp):
        return any(_type_ok(value, t) for t in get_args(tp))
    if get_origin(tp) is list:
        return isinstance(value, list) and all(_type_ok(v, get_args(tp)[0]) for v in value)
    if tp is type(None):
        return value is None
    if tp is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if tp is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, tp) if isinstance(tp, type) else True


def _type_name(tp) -> str:
    from typing import get_args, get_origin

    if _is_union(tp):
        names = [_type_name(t) for t in get_args(tp)]
        return ", ".join(names[:-1]) + " or " + names[-1]
    if get_origin(tp) is list:
        return f"a list of {_type_name(get_args(tp)[0])}"
    return "null" if tp is type(None) else getattr(tp, "__name__", str(tp))


def _wrong_type(key: str, value, tp) -> str:
    """``KEY takes <type>, got <type> <value>``: the one line a value of the wrong type gets, from a file or --set."""
    got = "null" if value is None else f"{type(value).__name__} {value!r}"
    return f"{key} takes {_type_name(tp)}, got {got}"


def parse_sets(items: list[str] | tuple[str, ...]) -> dict:
    """``--set KEY=VALUE`` items as the nested overrides ``load_config`` takes.

    KEY is ``section.field`` for a field of a RunConfig section (``rollout.temperature``, ``loss.eps_high``)
    or a top-level field (``task``, ``seeds``, ``algos``); ``task.FIELD`` is ``task_options.FIELD``
    (``task.path``, ``task.chat``). VALUE is read by ``load_yaml`` as one YAML value,
    so ``3e-4``, ``null``, ``true`` and ``[0, 1]`` are a float, None, a bool and a list; quote to force a
    string (``model.name="'123'"``). A later item for the same KEY wins. A missing ``=``, an unknown section
    or field, or a value whose type the field does not take is a ConfigError naming the key; the values
    themselves are then checked by ``load_config`` like any other setting.
    """
    sections = {f.name: sec for f in fields(RunConfig) if (sec := _section_type(RunConfig, f.name))}
    top = {k: t for k, t in _field_types(RunConfig).items() if k not in sections and k != "preset"}
    out: dict = {}
    for item in items:
        key, eq, raw = item.partition("=")
        key = key.strip()
        # what an error message echoes stays on one line: control characters are shown escaped
        key_s, raw_s = _one_line(key), _one_line(raw)
        if not eq or not key:
            raise ConfigError(f"--set {item!r}: expected KEY=VALUE, e.g. rollout.temperature=0.7")
        head, _, name = key.partition(".")
        if head == "task" and name:  # task.path, task.chat, ...: the task's options (the top-level task is its name)
            head = "task_options"
        if head == "preset" and not name:
            raise ConfigError(f"--set {key_s}: choose the preset with --preset NAME")
        if head in sections:
            known = _field_types(sections[head])
            if not name:
                raise ConfigError(f"--set {key_s}: {head} is a section; set one of its fields, e.g. "
                                  f"{head}.{next(iter(known))}=... (fields: {', '.join(known)})")
            if name not in known:
                raise ConfigError(f"--set {key_s}: unknown field {name!r} in {head} (allowed: {', '.join(known)})")
            tp, where = known[name], out.setdefault(head, {})
        elif head in top and not name:
            tp, where = top[head], out
        else:
            raise ConfigError(f"--set {key_s}: unknown key (sections: {', '.join(sections)}; top-level fields: "
                              f"{', '.join(top)})")
        try:
            value = load_yaml(raw)
        except yaml.YAMLError as e:
            first = str(e).strip().splitlines()[0]
            raise ConfigError(f"--set {key_s}={raw_s}: not a YAML value ({first})") from None
        if not _type_ok(value, tp):
            hint = "; quote it to pass a string" if value is not None and _type_ok("", tp) else ""
            raise ConfigError(f"--set {key_s}={raw_s}: {_wrong_type(key_s, value, tp)}{hint}")
        where[name or head] = value
    return out


def _one_line(text: str) -> str:
    """Text as typed when printable, else its escaped repr (a newline in --set must not split an error)."""
    return text if text.isprintable() else repr(text)


def to_dict(cfg) -> dict:
    """A config, a section or a ``LossSettings`` as plain nested dicts (``dataclasses.asdict``), with a SPREAD
    field's keys written in its section, as YAML and ``--set`` name them (``loss.eps_high``)."""
    if not dataclasses.is_dataclass(cfg):
        return copy.deepcopy(cfg)
    out: dict = {}
    for f in fields(cfg):
        value = to_dict(getattr(cfg, f.name))
        if f.metadata.get("spread"):
            out.update(value)
        else:
            out[f.name] = value
    return out


def flatten(d: dict, prefix: str = "") -> dict[str, Any]:
    """{'loss': {'eps_low': 0.2}} -> {'loss.eps_low': 0.2} (for MLflow params)."""
    out = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(flatten(v, key + "."))
        else:
            out[key] = v
    return out
