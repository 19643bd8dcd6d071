"""Presets, baselines, merging and validation (gspo_bench.config)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from gspo_bench.config import (
    AUTO,
    LOGIT_CHUNK_TOKENS,
    ConfigError,
    RunConfig,
    deep_merge,
    flatten,
    load_config,
    load_yaml,
    parse_sets,
    presets,
    to_dict,
)
from gspo_bench.core.losses import LOSSES
from gspo_bench.paths import builtin_dir

BASELINES = sorted(builtin_dir("baselines").glob("*.yaml"))


def test_presets_are_found():
    assert {"default", "smoke"} <= set(presets())


def test_default_preset():
    cfg = load_config("default")
    assert isinstance(cfg, RunConfig)
    assert cfg.preset == "default"
    assert cfg.algos == ["ppo", "grpo", "dapo", "gspo", "gspo_token", "cispo"]
    assert cfg.task == "arith" and cfg.seeds == [0] and cfg.model.name == "tiny-dense"
    assert (cfg.rollout.prompts_per_step, cfg.rollout.group_size) == (64, 8)
    assert (cfg.train.steps, cfg.train.minibatches, cfg.train.lr, cfg.train.lr_schedule) == (40, 4, 0.0004, "linear")
    assert cfg.warmstart.target_pass1 == 0.4 and cfg.warmstart.tolerance == 0.03 and cfg.warmstart.lr == 0.003
    # untouched fields keep their dataclass defaults
    assert cfg.loss.eps_low == AUTO and cfg.rollout.max_new_tokens == AUTO
    assert cfg.collapse.on_collapse == "continue"


def test_smoke_preset():
    cfg = load_config("smoke")
    assert cfg.preset == "smoke"
    # the preset names its own list (the six it has always run); ``--algos all`` is the registry
    assert cfg.algos == ["ppo", "grpo", "dapo", "gspo", "gspo_token", "cispo"] and set(cfg.algos) <= set(LOSSES)
    assert (cfg.rollout.prompts_per_step, cfg.rollout.group_size) == (4, 4)
    assert (cfg.train.steps, cfg.train.eval_every, cfg.train.eval_prompts, cfg.train.eval_samples) == (3, 2, 64, 2)
    assert (cfg.warmstart.max_steps, cfg.warmstart.target_pass1, cfg.warmstart.eval_every) == (150, 0.05, 25)


def test_baselines_cover_every_algorithm():
    algos = [yaml.safe_load(p.read_text())["algo"] for p in BASELINES]
    assert sorted(algos) == sorted(LOSSES)


@pytest.mark.parametrize("path", BASELINES, ids=[p.stem for p in BASELINES])
def test_each_baseline_loads_over_default(path: Path):
    raw = yaml.safe_load(path.read_text())
    cfg = load_config("default", (str(path),))
    assert cfg.algos == [raw["algo"]]
    assert cfg.source == raw["source"] and cfg.source
    assert cfg.loss.eps_low == raw["loss"]["eps_low"]
    assert cfg.loss.eps_high == raw["loss"]["eps_high"]
    # every other section value in the file made it through
    for section, values in raw.items():
        if isinstance(values, dict):
            for k, v in values.items():
                assert getattr(getattr(cfg, section), k) == v, (section, k)
    # and the preset's values the baseline does not mention are kept
    assert cfg.rollout.prompts_per_step == 64 and cfg.train.steps == 40


def test_specific_baseline_values():
    by_algo = {yaml.safe_load(p.read_text())["algo"]: p for p in BASELINES}
    cispo = load_config("default", (str(by_algo["cispo"]),))
    assert cispo.loss.eps_low is None and cispo.loss.eps_high == 4.0
    gspo = load_config("default", (str(by_algo["gspo"]),))
    assert (gspo.loss.eps_low, gspo.loss.eps_high) == (3e-4, 4e-4)
    dapo = load_config("default", (str(by_algo["dapo"]),))
    assert (dapo.loss.eps_low, dapo.loss.eps_high) == (0.2, 0.28)
    assert dapo.rollout.dynamic_sampling is True and dapo.rollout.overlong_buffer == AUTO


def test_overrides_merge_over_preset_and_files(tmp_path):
    f = tmp_path / "mine.yaml"
    f.write_text("loss:\n  eps_high: 0.5\n  kl_coef: 0.01\ntrain:\n  steps: 9\n")
    cfg = load_config("smoke", (str(f),), {"train": {"steps": 7}, "rollout": {"group_size": 2}, "algo": "gspo"})
    assert cfg.train.steps == 7  # the override beats the file
    assert cfg.train.minibatches == 4 and cfg.train.eval_every == 2  # smoke's siblings survive
    assert cfg.rollout.group_size == 2 and cfg.rollout.prompts_per_step == 4
    assert cfg.loss.eps_high == 0.5 and cfg.loss.kl_coef == 0.01  # from the file
    assert cfg.loss.eps_low == AUTO
    assert cfg.algos == ["gspo"]  # singular algo accepted
    assert cfg.preset == "smoke"


def test_later_config_file_wins(tmp_path):
    a, b = tmp_path / "a.yaml", tmp_path / "b.yaml"
    a.write_text("loss: {eps_low: 0.1, eps_high: 0.3}\n")
    b.write_text("loss: {eps_low: 0.15}\n")
    cfg = load_config("default", (str(a), str(b)))
    assert (cfg.loss.eps_low, cfg.loss.eps_high) == (0.15, 0.3)


def test_deep_merge_by_hand():
    base = {"a": 1, "s": {"x": 1, "y": 2}, "l": [1, 2]}
    out = deep_merge(base, {"s": {"y": 3, "z": 4}, "l": [9], "b": 2})
    assert out == {"a": 1, "s": {"x": 1, "y": 3, "z": 4}, "l": [9], "b": 2}
    assert base == {"a": 1, "s": {"x": 1, "y": 2}, "l": [1, 2]}  # input not mutated


def test_flatten_and_to_dict():
    assert flatten({"loss": {"eps_low": 0.2, "k": {"j": 1}}, "task": "arith"}) == {
        "loss.eps_low": 0.2, "loss.k.j": 1, "task": "arith"}
    flat = flatten(to_dict(load_config("smoke")))
    assert flat["train.steps"] == 3 and flat["rollout.group_size"] == 4 and flat["model.name"] == "tiny-dense"


@pytest.mark.parametrize("overrides,needles", [
    ({"loss": {"eps_low": 1.0}}, ["eps_low", "1.0"]),
    ({"loss": {"eps_low": 1.5}}, ["eps_low", "1.5"]),
    ({"loss": {"eps_low": -0.1}}, ["eps_low", "-0.1"]),
    ({"loss": {"eps_high": float("inf")}}, ["eps_high", "inf"]),
    ({"loss": {"dual_clip_c": 0.5}}, ["dual_clip_c", "0.5"]),
    ({"loss": {"kl_estimator": "k9"}}, ["kl_estimator", "k9"]),
    ({"train": {"steps": -3}}, ["train.steps", "-3"]),
    ({"train": {"steps": 0}}, ["train.steps", "0"]),
    ({"train": {"steps": 2.5}}, ["train.steps", "2.5"]),
    ({"algos": []}, ["algos"]),
    ({"rollout": {"group_size": 1}}, ["group_size", "1"]),
    ({"rollout": {"engine": ""}}, ["rollout.engine", "an engine's name"]),
    ({"rollout": {"max_new_tokens": 0}}, ["max_new_tokens", "0"]),
    ({"rollout": {"overlong_buffer": -4}}, ["overlong_buffer", "-4"]),
    ({"rollout": {"dynamic_sampling": "sometimes"}}, ["dynamic_sampling", "sometimes"]),
    ({"model": {"dtype": "int8"}}, ["dtype", "int8"]),
    ({"collapse": {"on_collapse": "panic"}}, ["on_collapse", "panic"]),
    ({"seeds": [0, -1]}, ["seeds", "-1"]),
    ({"warmstart": {"target_pass1": 1.5}}, ["target_pass1", "1.5"]),
    ({"stepz": 3}, ["unknown key", "stepz"]),
    ({"train": {"stepz": 3}}, ["unknown key", "stepz", "train"]),
    ({"loss": 0.2}, ["loss", "mapping"]),
    ({"loss": {"tau_pos": 0.0}}, ["loss.tau_pos", "0.0"]),
    ({"loss": {"tau_neg": -1.0}}, ["loss.tau_neg", "-1.0"]),
    ({"loss": {"lam_pos": "big"}}, ["loss.lam_pos", "big"]),
    ({"loss": {"k_neg": float("nan")}}, ["loss.k_neg", "nan"]),
    ({"loss": {"trunc_c": 0}}, ["loss.trunc_c", "0"]),
    ({"rollout": {"advantage_scale": "std"}}, ["rollout.advantage_scale", "std"]),
    ({"rollout": {"advantage_baseline": "median"}}, ["rollout.advantage_baseline", "median"]),
    ({"rollout": {"advantage_estimator": "median"}}, ["rollout.advantage_estimator", "median", "allowed: group"]),
    ({"rollout": {"correction_level": "batch"}}, ["rollout.correction_level", "batch"]),
    ({"rollout": {"correction_min": 2.5}}, ["rollout.correction_min", "2.5"]),
    ({"rollout": {"correction_min": -0.1}}, ["rollout.correction_min", "-0.1"]),
    ({"rollout": {"opsm_threshold": -1.0}}, ["rollout.opsm_threshold", "-1.0"]),
    ({"train": {"logit_chunk_tokens": -1}}, ["train.logit_chunk_tokens=-1", "0 (all tokens at once)"]),
    ({"train": {"logit_chunk_tokens": 512.0}}, ["train.logit_chunk_tokens=512.0", "int"]),
    ({"train": {"logit_chunk_tokens": True}}, ["train.logit_chunk_tokens=True"]),
    ({"train": {"logit_chunk_tokens": "big"}}, ["train.logit_chunk_tokens='big'", "or auto (sized to the device)"]),
    ({"train": {"activation_checkpointing": "yes"}}, ["train.activation_checkpointing='yes'"]),
])
def test_bad_values_raise_config_error(overrides, needles):
    with pytest.raises(ConfigError) as e:
        load_config("smoke", overrides=overrides)
    for n in needles:
        assert n in str(e.value), (n, str(e.value))


@pytest.mark.parametrize("overrides,name", [({"algos": ["grpo", "trpo"]}, "trpo"), ({"algo": "reinforce"}, "reinforce")])
def test_unknown_algorithms_load_but_fail_validation_before_any_run(overrides, name):
    # the config names algorithms without importing them (no torch); the runner's checks know the registered ones
    from gspo_bench.train.runner import validate

    cfg = load_config("smoke", overrides=overrides)
    with pytest.raises(ConfigError) as e:
        validate(cfg)
    assert f"unknown algorithm {name!r}" in str(e.value) and "grpo" in str(e.value)


def test_config_error_is_a_value_error():
    assert issubclass(ConfigError, ValueError)


@pytest.mark.parametrize("name, model", [("gpu-dense", "dense-0.5b"), ("gpu-moe", "moe-0.16b")])
def test_gpu_presets(name, model):
    cfg = load_config(name)
    assert cfg.preset == name and cfg.model.name == model and cfg.task == "arith"
    assert (cfg.rollout.engine, cfg.rollout.dtype, cfg.model.dtype) == ("vllm", "bfloat16", "float32")
    assert cfg.train.precision == "bf16-mixed"  # bfloat16 autocast over float32 master weights
    assert (cfg.rollout.prompts_per_step, cfg.rollout.group_size, cfg.rollout.max_new_tokens) == (64, 8, 256)
    assert cfg.warmstart.enabled is False  # the tiny models' pass@1 band says nothing about these
    # a CPU cut-size run overrides what it must
    small = load_config(name, overrides=parse_sets(["train.precision=32-true", "rollout.prompts_per_step=2"]))
    assert (small.train.precision, small.rollout.prompts_per_step) == ("32-true", 2)


def test_train_precision_is_one_of_lightnings_names():
    assert load_config("default").train.precision == "32-true"
    with pytest.raises(ConfigError, match=r"train.precision='bf16' is not allowed \(allowed: 32-true, bf16-mixed"):
        load_config("default", overrides={"train": {"precision": "bf16"}})


def test_training_memory_keys():
    t = load_config("default").train
    assert (t.logit_chunk_tokens, t.activation_checkpointing) == (LOGIT_CHUNK_TOKENS, False) == (4096, False)
    t = load_config("default", overrides=parse_sets(["train.logit_chunk_tokens=0",
                                                     "train.activation_checkpointing=true"])).train
    assert (t.logit_chunk_tokens, t.activation_checkpointing) == (0, True)  # 0: the whole minibatch's logits at once
    assert load_config("default", overrides=parse_sets(["train.logit_chunk_tokens=auto"])).train.logit_chunk_tokens \
        == "auto"


def test_unknown_preset():
    with pytest.raises(ConfigError) as e:
        load_config("turbo")
    assert "'turbo'" in str(e.value) and "default" in str(e.value) and "smoke" in str(e.value)


def test_missing_config_file(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_config("default", (str(tmp_path / "nope.yaml"),))


def test_config_file_must_be_a_mapping(tmp_path):
    f = tmp_path / "list.yaml"
    f.write_text("- 1\n- 2\n")
    with pytest.raises(ConfigError, match="mapping"):
        load_config("default", (str(f),))


def test_bad_value_in_a_config_file(tmp_path):
    f = tmp_path / "bad.yaml"
    f.write_text("loss:\n  eps_low: 1.2\n")
    with pytest.raises(ConfigError, match=r"eps_low=1\.2"):
        load_config("default", (str(f),))


# ----------------------------------------------------------------------------- regressions


def test_exponent_without_dot_in_yaml_is_a_float(tmp_path):
    f = tmp_path / "lr.yaml"
    f.write_text("train:\n  lr: 3e-4\nloss:\n  eps_low: 3e-4\n  eps_high: 4e-4\n")
    cfg = load_config("default", (str(f),))
    assert cfg.train.lr == 3e-4
    assert (cfg.loss.eps_low, cfg.loss.eps_high) == (3e-4, 4e-4)


@pytest.mark.parametrize("overrides", [
    {"collapse": {"entropy_floor": "1e-3"}},
    {"collapse": {"reward_drop": "0.3"}},
    {"collapse": {"ratio_max": "big"}},
    {"rollout": {"overlong_penalty": "1e0"}},
    {"loss": {"vf_coef": "5e-1"}},
])
def test_unvalidated_numeric_fields_reject_strings(overrides):
    with pytest.raises(ConfigError):
        load_config("smoke", overrides=overrides)


def test_parse_sets_reads_yaml_values():
    over = parse_sets(["rollout.temperature=0.7", "loss.eps_high=3e-4", "loss.eps_low=null", "warmstart.enabled=false",
                       "seeds=[0,1]", "algos=[gspo, grpo]", "task=arith", "rollout.max_new_tokens=auto",
                       "model.name='123'", "train.lr=1", "tracking.experiment=a=b"])
    assert over == {"rollout": {"temperature": 0.7, "max_new_tokens": "auto"},
                    "loss": {"eps_high": 3e-4, "eps_low": None}, "warmstart": {"enabled": False},
                    "seeds": [0, 1], "algos": ["gspo", "grpo"], "task": "arith", "model": {"name": "123"},
                    "train": {"lr": 1}, "tracking": {"experiment": "a=b"}}
    assert isinstance(over["loss"]["eps_high"], float)
    assert parse_sets([]) == {}


def test_parse_sets_merges_nested_and_over_files(tmp_path):
    over = parse_sets(["rollout.temperature=0.5", "rollout.group_size=4", "rollout.temperature=0.9"])
    assert over == {"rollout": {"temperature": 0.9, "group_size": 4}}  # the later item wins
    f = tmp_path / "c.yaml"
    f.write_text("rollout:\n  prompts_per_step: 3\n  group_size: 2\ntrain:\n  steps: 7\n")
    cfg = load_config("smoke", (str(f),), over)
    assert (cfg.rollout.temperature, cfg.rollout.group_size, cfg.rollout.prompts_per_step) == (0.9, 4, 3)
    assert cfg.train.steps == 7  # the file's other settings stay


@pytest.mark.parametrize("item, needles", [
    ("rollout.nope=1", ["rollout.nope", "unknown field 'nope'", "temperature"]),
    ("nope.temperature=1", ["nope.temperature", "unknown key", "rollout"]),
    ("nope=1", ["nope", "unknown key", "seeds"]),
    ("rollout=1", ["rollout", "is a section"]),
    ("rollout.group_size.x=3", ["rollout.group_size.x", "unknown field"]),
    ("preset=smoke", ["preset", "--preset"]),
    ("rollout.temperature", ["rollout.temperature", "KEY=VALUE"]),
    ("=0.7", ["KEY=VALUE"]),
    ("rollout.temperature=hot", ["rollout.temperature", "takes float", "'hot'"]),
    ("train.steps=1.5", ["train.steps", "takes int", "1.5"]),
    ("train.steps=true", ["train.steps", "takes int", "bool"]),
    ("seeds=0", ["seeds", "list of int"]),
    ("seeds=[0, x]", ["seeds", "list of int"]),
    ("warmstart.enabled=1", ["warmstart.enabled", "takes bool"]),
    ("task=", ["task", "got null"]),
    ("model.name=123", ["model.name", "takes str", "quote"]),
    ("loss.eps_low=[0.1]", ["loss.eps_low", "float, str or null"]),
    ("rollout.temperature=[1", ["rollout.temperature", "not a YAML value"]),
])
def test_parse_sets_rejects_bad_keys_types_and_syntax(item, needles):
    with pytest.raises(ConfigError) as e:
        parse_sets(["rollout.group_size=4", item])
    msg = str(e.value)
    assert all(n in msg for n in needles), msg
    assert "\n" not in msg


def test_set_values_are_validated_like_any_other_setting():
    with pytest.raises(ConfigError, match="rollout.temperature"):
        load_config("smoke", overrides=parse_sets(["rollout.temperature=-1"]))
    with pytest.raises(ConfigError, match="rollout.engine"):
        load_config("smoke", overrides=parse_sets(["rollout.engine=[1, 2]"]))
    with pytest.raises(ConfigError, match=r"rollout.moe_kernel='fused' is not allowed \(allowed: auto, grouped"):
        load_config("smoke", overrides=parse_sets(["rollout.moe_kernel=fused"]))
    assert load_config("smoke", overrides=parse_sets(["rollout.moe_kernel=batched"])).rollout.moe_kernel == "batched"


def test_parse_sets_type_checks_every_field():
    """Each field's annotation is one parse_sets understands (an unknown one would let any value through)."""
    from dataclasses import fields

    from gspo_bench.config.loading import _field_types, _section_type, _type_ok

    sections = [s for f in fields(RunConfig) if (s := _section_type(RunConfig, f.name))]
    for cls in (RunConfig, *sections):
        for name, tp in _field_types(cls).items():
            if tp not in sections:
                assert not _type_ok(object(), tp), f"{cls.__name__}.{name}: {tp} is not type-checked by --set"


# the stress presets keep the constant learning rate they were calibrated and measured at (2e-4, or their own)
# where the default now decays a higher one linearly
CONSTANT = {"train.lr": 0.0002, "train.lr_schedule": "constant"}
SCENARIO_CHANGES = {  # the stress presets: the default preset at a constant rate, plus exactly one stress
    "long": {"task": "arith_scratchpad", **CONSTANT},
    "offpolicy": {"train.minibatches": 16, **CONSTANT},
    "stale": {"rollout.staleness": 2, "rollout.old_logp_source": "rollout", **CONSTANT},
    "moe-bf16": {"model.name": "tiny-moe", "rollout.dtype": "bfloat16", **CONSTANT},
    "hot": {**CONSTANT, "train.lr": 0.0015},
    # one stress, three settings: a cold sampler and a fast learner over twice the steps, with the floor at which
    # the detector calls the entropy's fall a collapse
    "entropy": {"rollout.temperature": 0.3, **CONSTANT, "train.lr": 0.0006, "train.steps": 80,
                "collapse.entropy_floor": 0.1},
}


@pytest.mark.parametrize("name", sorted(SCENARIO_CHANGES))
def test_stress_presets_are_the_default_plus_one_stress(name):
    from gspo_bench.config import flatten, to_dict

    base = flatten(to_dict(load_config("default")))
    cfg = flatten(to_dict(load_config(name)))
    changed = {k: v for k, v in cfg.items() if base.get(k) != v and k != "preset"}
    assert changed == SCENARIO_CHANGES[name]
    first = (Path(__file__).resolve().parents[1] / "gspo_bench" / "presets" / f"{name}.yaml").read_text().splitlines()[0]
    assert first.startswith("# Stress: ")  # the one-line description `list` shows


def test_response_cap_is_the_set_cap_or_none_for_auto():
    assert load_config("smoke").rollout.response_cap() is None  # auto: the task's own
    assert load_config("smoke", overrides={"rollout": {"max_new_tokens": 12}}).rollout.response_cap() == 12


def test_new_loss_and_rollout_fields_resolve():
    from gspo_bench import algorithms

    cfg = load_config("default", overrides={"loss": {"tau_pos": 2.0}, "rollout": {"correction": "mis",
                                            "correction_min": 0.25, "correction_level": "sequence",
                                            "opsm_threshold": 0.1, "advantage_baseline": "leave_one_out"}})
    sapo = cfg.resolve("sapo", algorithms.get("sapo").recipe, 8)
    assert (sapo.loss.tau_pos, sapo.loss.tau_neg) == (2.0, 1.05)  # explicit, then auto = the loss's default
    assert (sapo.rollout.correction_min, sapo.rollout.correction_level, sapo.rollout.opsm_threshold) == (
        0.25, "sequence", 0.1)
    assert sapo.rollout.advantage_baseline == "leave_one_out" and sapo.rollout.advantage_scale == "group"
    dr = cfg.resolve("dr_grpo", algorithms.get("dr_grpo").recipe, 8)
    assert dr.rollout.advantage_scale == "none" and dr.loss.tau_neg is None
    vespo = load_config("default").resolve("vespo", algorithms.get("vespo").recipe, 8)
    assert (vespo.loss.k_pos, vespo.loss.lam_pos, vespo.loss.k_neg, vespo.loss.lam_neg) == (2.0, 3.0, 3.0, 2.0)
    assert load_config("default").rollout.advantage_scale == AUTO
    batch = load_config("default", overrides={"rollout": {"advantage_scale": "batch"}})
    assert batch.resolve("dr_grpo", algorithms.get("dr_grpo").recipe, 8).rollout.advantage_scale == "batch"


def test_set_task_field_is_the_task_options_section():
    from gspo_bench.config import TaskOptions, load_config, parse_sets

    over = parse_sets(["task=gsm8k", "task.path=/data/gsm8k", "task.chat=false", "task.params={name: socratic}"])
    assert over == {"task": "gsm8k", "task_options": {"path": "/data/gsm8k", "chat": False,
                                                      "params": {"name": "socratic"}}}
    cfg = load_config("smoke", overrides=over)
    assert cfg.task == "gsm8k" and cfg.task_options == TaskOptions("/data/gsm8k", {"name": "socratic"}, False)
    with pytest.raises(ConfigError, match="task.chat=1 is not allowed"):
        load_config("smoke", overrides={"task_options": {"chat": 1}})


def test_task_options_left_at_null_stay_out_of_the_settings_digest():
    from gspo_bench.config import load_config, to_dict
    from gspo_bench.tracking.digest import hashed_settings

    flat = hashed_settings(to_dict(load_config("smoke")))
    assert not any(k.startswith("task_options.") for k in flat)  # digests of older runs still match
    flat = hashed_settings(to_dict(load_config("smoke", overrides={"task_options": {"chat": False}})))
    assert flat["task_options.chat"] is False


@pytest.mark.parametrize("value, in_file", [
    ("1", "rollout.mask_truncated takes bool, got int 1"),  # was accepted from a file, and digested apart from true
    ("yes", "rollout.mask_truncated='yes' is not allowed (allowed: True, False)"),
    ("on", "rollout.mask_truncated='on' is not allowed (allowed: True, False)"),
])
def test_a_bool_is_true_or_false_in_a_config_file_as_in_set(value, in_file, tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text(f"rollout:\n  mask_truncated: {value}\n")
    with pytest.raises(ConfigError, match=re.escape(in_file)):
        load_config("smoke", config_files=(str(path),))
    got = "int 1" if value == "1" else f"str {value!r}"
    with pytest.raises(ConfigError, match=re.escape(f"rollout.mask_truncated takes bool, got {got}")):
        parse_sets([f"rollout.mask_truncated={value}"])
    path.write_text("rollout:\n  mask_truncated: true\n")
    assert load_config("smoke", config_files=(str(path),)).rollout.mask_truncated is True


def test_numbers_are_read_without_yaml_1_1_underscores():
    # "lo_hi" bands stay the text typed (YAML 1.1 read 2_0.5 as 20.5 and 0.5_2 as 0.52)
    assert [load_yaml(t) for t in ("0.5_2", "2_0.5", "1_000")] == ["0.5_2", "2_0.5", "1_000"]
    assert [load_yaml(t) for t in ("3e-4", "1.5", "-2", ".5", "1e308")] == [3e-4, 1.5, -2, 0.5, 1e308]
    with pytest.raises(ConfigError, match=re.escape("train.steps=1_000: train.steps takes int, got str '1_000'")):
        parse_sets(["train.steps=1_000"])
    over = parse_sets(["rollout.rejection=token_k1", "rollout.rejection_threshold=0.5_2"])
    assert load_config("smoke", overrides=over).rollout.rejection_threshold == "0.5_2"
