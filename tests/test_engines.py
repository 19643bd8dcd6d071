"""The rollout-engine registry (gspo_bench.rollout.engines): names, ``auto``, and a new engine as one file."""

from __future__ import annotations

import dataclasses
import types

import pytest
import torch
from rich.console import Console

from gspo_bench.config import ConfigError, RolloutConfig, load_config, parse_sets
from gspo_bench.config import names as config_names
from gspo_bench.models import build_builtin
from gspo_bench.rollout.datamodule import RolloutDataModule
from gspo_bench.rollout.engine import encode_prompts, finish_generation
from gspo_bench.rollout.engines import (ENGINES, Capabilities, InProcessEngine, RolloutEngine, build_engine,
                                        check_engine, engine_names, register_engine, resolve_engine,
                                        route_recorders, sharded_engine, unregister_engine)
from gspo_bench.tasks import Task, TaskSpec, generate_arith


def test_the_engine_name_is_checked_against_the_registry_alone():
    # config sits below rollout: it checks the value is a name, the registry's check knows the names
    cfg = load_config("smoke", overrides=parse_sets(["rollout.engine=warp"]))
    with pytest.raises(ConfigError, match=r"rollout.engine: unknown engine 'warp' \(allowed: auto, fast, compiled"):
        check_engine(cfg)
    for name in ("auto", *engine_names()):
        cfg.rollout.engine = name
        try:
            check_engine(cfg)
        except ConfigError as e:  # a registered engine may be missing here (vllm without its wheel): not a name
            assert "unknown engine" not in str(e)
    with pytest.raises(ConfigError, match="rollout.engine='' must be auto or an engine's name"):
        RolloutConfig(engine="")
    assert not hasattr(config_names, "ENGINES")


def test_every_registered_engine_fills_the_seam():
    for name, cls in ENGINES.items():
        assert cls.name == name and isinstance(cls.capabilities, Capabilities)
        engine = build_engine(name)
        assert isinstance(engine, RolloutEngine)
        engine.close()
    # the engines that sample the policy module itself have nothing to push or time
    hf = build_engine("hf")
    assert hf.sync_weights({}, 3) == 0.0 and hf.version == 3 and hf.take_sync_time() is None


def test_auto_reads_the_registry():
    qwen, _ = build_builtin("tiny-dense", 0)
    # tiny-dense is below vLLM's size threshold on a CPU: the fast engine, held or not
    assert resolve_engine("auto", qwen) == "fast" == resolve_engine("auto", qwen, held=True)
    qwen.generation_config.suppress_tokens = [5]  # a logits processor the fast engine does not apply
    assert resolve_engine("auto", qwen) == "hf"
    assert resolve_engine("compiled", qwen) == "hf"  # compiled declares hf its fallback
    assert resolve_engine("fast", qwen) == "fast"  # fast declares none: sampling says why it cannot
    with pytest.raises(ValueError, match="unknown engine 'sglang'"):
        resolve_engine("sglang", qwen)


def test_the_engines_say_what_they_read_so_no_caller_names_them():
    # FSDP shards the policy: an engine that reads whole parameters (or auto, which may pick one) gives way to
    # the first in auto order that samples through the model's own forward; the others keep theirs
    whole = {n for n, c in ENGINES.items() if c.capabilities.whole_parameters}
    assert whole == {"fast", "compiled"}
    assert [sharded_engine(n) for n in ("auto", "fast", "compiled", "hf", "vllm")] == ["hf", "hf", "hf", "hf", "vllm"]
    # Rollout Routing Replay's error lists the engines that can record routes, from their capabilities
    assert route_recorders() == [n for n in ENGINES if ENGINES[n].capabilities.records_routes]
    assert {"fast", "hf"} <= set(route_recorders())


def test_a_toy_engine_s_capabilities_reach_the_fsdp_choice(toy):
    assert sharded_engine("toy") == "toy"  # it reads no whole parameters: FSDP keeps it
    toy.capabilities = Capabilities(free_logp=False, records_routes=True, auto_order=-1, whole_parameters=True)
    try:
        assert sharded_engine("toy") == "hf" and "toy" in route_recorders()
    finally:
        toy.capabilities = Capabilities(free_logp=False, records_routes=False, auto_order=-1)


# ----------------------------------------------------------------------------- a new engine, one file

ANSWER = "42"


class ToyEngine(InProcessEngine):
    """Answers every prompt with ``ANSWER`` then eos (what docs/engines.md walks through)."""

    capabilities = Capabilities(free_logp=False, records_routes=False, auto_order=-1)

    def sample(self, model, tokenizer, prompts, *, max_new_tokens, temperature=1.0, greedy=False,
               return_logp=True, record_routes=False, draws=None):
        enc, eos = encode_prompts(model, tokenizer, prompts)
        ids = tokenizer(ANSWER, add_special_tokens=False)["input_ids"][:max_new_tokens - 1] + [eos[0]]
        resp = torch.tensor([ids] * len(prompts), device=enc["input_ids"].device)
        return finish_generation(tokenizer, enc, resp, eos)


@pytest.fixture
def toy():
    register_engine("toy")(ToyEngine)
    yield ToyEngine
    unregister_engine("toy")


def test_a_registered_toy_engine_samples_a_rollout_and_the_checks_see_it(toy):
    model, tok = build_builtin("tiny-dense", 0)
    train, evals = generate_arith(0, min_digits=1, max_digits=2, n_train=40, n_eval=8)
    task = Task(TaskSpec(name="arith-small", kind="arith"), train, evals)
    # auto_order -1: ahead of every built-in engine, so ``auto`` resolves to it
    settings = RolloutConfig(prompts_per_step=2, group_size=3, max_new_tokens=4, dynamic_sampling=False,
                             overlong_buffer=None, advantage_scale="group")
    dm = RolloutDataModule(task, tok, settings, steps=1, seed=0, policy=model, eval_prompts=4)
    batch = dm.rollout(0)
    assert isinstance(dm.engine, ToyEngine) and dm.engine_name() == "toy"
    assert batch.texts == [ANSWER] * 6 and batch.rollout_logp is None
    assert batch.response_mask.sum(-1).tolist() == [3.0] * 6  # "4", "2", eos
    assert "time/weight_sync" not in batch.stats  # nothing pushed
    metrics = dm.evaluator.run(dm, model)
    assert set(metrics) == {"eval/pass1", "eval/pass1_even", "eval/pass1_odd"}
    # the name check and ``list`` read the registry
    cfg = load_config("smoke")
    cfg.rollout.engine = "toy"
    check_engine(cfg)
    cfg.rollout.engine = "warp"
    with pytest.raises(ConfigError, match="unknown engine 'warp'.*toy"):
        check_engine(cfg)
    from gspo_bench.cli.info import list_command

    console = Console(record=True, width=200)
    list_command(types.SimpleNamespace(), console)
    assert "toy" in console.export_text()
    dm.close_engine()


def test_the_toy_engine_is_gone_after_its_test():
    assert "toy" not in ENGINES


@pytest.mark.parametrize("argv", [
    ["run", "--preset", "smoke", "--engine", "sglang"],
    ["bench", "--set", "rollout.engine=sglang"],
    ["bench", "--memory", "none", "--prompts", "1", "--set", "rollout.engine=sglang"],
])
def test_an_unregistered_engine_is_one_line_exit_2_before_any_work(tmp_path, argv):
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    proc = subprocess.run([sys.executable, "-m", "gspo_bench", *argv], cwd=tmp_path, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(root), "MLFLOW_TRACKING_URI": uri,
                               "GSPO_BENCH_CACHE": str(tmp_path / "cache")}, timeout=300)
    out = (proc.stdout + proc.stderr).strip()
    assert proc.returncode == 2 and len(out.splitlines()) == 1, out
    assert "unknown engine 'sglang'" in out and "fast" in out, out
    assert sorted(p.name for p in tmp_path.iterdir()) == [], "no store, cache or output is made"


# -- an engine's own settings ----------------------------------------------------------------------------------
@pytest.mark.parametrize("given, says", [
    ({"vllm": {"kv": 1}}, "rollout.engine_options.vllm: unknown option 'kv' (engine vllm takes "
                          "gpu_memory_utilization, kv_cache_mb, enforce_eager, keep)"),
    ({"vllm": {"kv_cache_mb": 0}}, "rollout.engine_options.vllm.kv_cache_mb=0 must be a positive int (MiB)"),
    ({"vllm": {"gpu_memory_utilization": 1.5}}, "gpu_memory_utilization=1.5 must be a number in (0, 1]"),
    ({"vllm": {"enforce_eager": "yes"}}, "enforce_eager='yes' must be true, false or null"),
    ({"vllm": {"keep": 1}}, "keep=1 must be true or false"),
    ({"fast": {"x": 1}}, "rollout.engine_options.fast: engine fast takes no options"),
    ({"nope": {}}, "rollout.engine_options: no engine 'nope' (engines: fast, compiled, hf, vllm"),
])
def test_engine_options_are_checked_by_their_engine_before_any_work(given, says, capsys):
    from gspo_bench.cli.main import main
    from gspo_bench.rollout.engines import check_engine

    with pytest.raises(ConfigError) as e:
        check_engine(load_config("smoke", overrides={"rollout": {"engine_options": given}}))
    assert says in str(e.value)
    import yaml

    text = yaml.safe_dump(given, default_flow_style=True).strip()
    assert main(["run", "--preset", "smoke", "--set", f"rollout.engine_options={text}",
                 "--tracking-uri", "sqlite:////nonexistent/never.db"]) == 2
    out = capsys.readouterr()
    assert says in (out.out + out.err) and len((out.out + out.err).strip().splitlines()) == 1


def test_the_vllm_engine_is_built_with_its_own_options(monkeypatch, tmp_path):
    from gspo_bench.rollout import vllm_engine
    from gspo_bench.rollout.engines import EngineSetup, engine_options

    s = load_config("smoke", overrides={"rollout": {"engine_options": {"vllm": {"kv_cache_mb": 512,
                                                                               "enforce_eager": True}}}}).rollout
    s = dataclasses.replace(s, max_new_tokens=8)
    assert engine_options("vllm", s).gpu_memory_utilization == 0.3  # the default where none is given
    assert engine_options("vllm", s).keep is False  # each run shuts its engine down unless told to keep it
    assert engine_options("fast", s) is None
    got = {}
    monkeypatch.setattr(vllm_engine, "lease", lambda folder, **kw: got.update(kw) or "built")  # what builds it
    model, tok = build_builtin("tiny-dense", 0)
    engine = ENGINES["vllm"](EngineSetup(s, seed=0, model_dir=str(tmp_path), prompts=lambda: ["1+2="]))
    assert engine.build(model, tok) == "built"
    assert (got["kv_cache_mb"], got["gpu_memory_utilization"], got["enforce_eager"]) == (512, 0.3, True)
