"""Supervised warm start, cached, shared by every algorithm of a run.

Random weights earn no reward on the built-in tasks (measured: 0 on 2-digit
addition with an exact-match verifier), so every policy-gradient method would
see all-zero groups and learn nothing. ``warm_start`` fine-tunes the model on
the task's train split (loss on the completion only) until greedy pass@1 on
a dev split reaches ``target_pass1``, then saves it with
``save_pretrained``. The checkpoint is keyed by task, model, seed and the
warm-start config, so every algorithm, and later runs, all start from the
very same weights.

Landing in a band. The supervised curve of these tiny models is a sharp
transition: greedy pass@1 climbs from ~20 % to ~50 % within ~50 steps at the
full learning rate, jumping up to ~10 points between two checks 10 steps
apart, and the step at which it starts varies by hundreds of steps between
seeds. So a fixed budget cannot land in a band, and a coarse check (every 50
steps on a 128-prompt subset, before) stopped wherever float rounding put the
crossing: on another CPU the same seed stopped at 28.9 % instead of 41.8 %.
Now the stop is checked every ``eval_every`` (10) steps on the whole dev
split, and a check that jumps past the band
(``target + tolerance``) is undone: the model and optimiser go back to the
last check below the target and go on with a smaller learning rate
(``backoff``) and more frequent checks (every 3 steps, then every step), so
the run climbs into the band with steps small enough to land in it. Near the
transition even one step at a tenth of the learning rate can move greedy
pass@1 by a point or more (measured on tiny-moe), so the finer checks matter
more than the smaller rate. The measured band over seeds is in
``results/warmstart-band.md`` (``warmstart --seeds N --markdown`` writes it). The checks use the fast engine's greedy decoding
(identical tokens to ``generate``'s, tested), which is what makes them cheap.

The dev split (``dev_split``) is held out of the train split, never trained on
by the warm start, and disjoint from the eval split: accepting the warm start
on the very prompts RL's final score is read on would select, among the
checks, one whose eval score is lucky, and bias the lift RL adds to it. The
eval split's score is still measured once at the end (``WarmStart.pass1``,
RL's step-0 starting point).
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import shutil
import tempfile
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch
from filelock import FileLock
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from gspo_bench import tables
from gspo_bench.config import EnvConfig, ModelConfig, TaskOptions, WarmStartConfig
from gspo_bench.rollout.engine import eos_ids
from gspo_bench.rollout.engines import generate
from gspo_bench.rollout.episodes import Episodes, episodes_for, play
from gspo_bench.models import BUILTIN_MODELS, build_builtin, classify_model_ref, load_pretrained
from gspo_bench.paths import cache_dir
from gspo_bench.tasks import Task, environment_name, is_multi_turn, scripted

CACHE_VERSION = 3  # 2: fine stop checks, target 40 %, overshoots undone; 3: accepted on a dev split, not the eval
DEV_SHARE = 4  # the dev split takes at most a quarter of the train split


@dataclass
class WarmStart:
    path: Path  # checkpoint directory (model + tokenizer)
    pass1: float  # greedy pass@1 on the whole eval split (RL's starting point)
    steps: int  # supervised steps taken
    seconds: float  # wall time of the fine-tune (0 when cached and not run now)
    cached: bool  # True when this call loaded an existing checkpoint
    dev_pass1: float | None = None  # greedy pass@1 on the dev split, where it was accepted (None: not fine-tuned)


def cache_key(task: Task, model_cfg: ModelConfig, ws: WarmStartConfig, seed: int, env: EnvConfig | None = None) -> str:
    payload = {
        "v": CACHE_VERSION,
        # a field left at its default (null) stays out, so keys made before it existed still match; chat and
        # system count through what they did to the prompts (prompt_format, below), not as written
        "task": {k: v for k, v in asdict(task.spec).items()
                 if not (k == "max_prompt_tokens" and v is None) and k not in ("chat", "system")
                 and not (k == "environment" and v == "single_turn")},
        "model": model_cfg.name,
        "dtype": model_cfg.dtype,
        "warmstart": asdict(for_model(ws, model_cfg.name)),  # what warm_start does with it
        "seed": seed,
    }
    if task.prompt_format is not None:  # prompts rendered through a chat template: its digest
        payload["prompt_format"] = task.prompt_format
    env = env or EnvConfig()
    if is_multi_turn(environment_name(task, env.name)):  # how its episodes are played: transcripts, checks
        payload["env"] = asdict(env)
    digest = hashlib.sha256(json.dumps(payload, sort_keys=True, default=str).encode()).hexdigest()[:16]
    slug = Path(model_cfg.name).name.replace("/", "_")
    return f"{task.name}-{slug}-s{seed}-{digest}"


def for_model(ws: WarmStartConfig, model: str) -> WarmStartConfig:
    """``ws``, switched off for a built-in model that is never warm-started (``BuiltinModel.warm_start``:
    qwen3-0.6b-arch, whose supervised climb would take days on a CPU and whose random weights are the point)."""
    spec = BUILTIN_MODELS.get(model)
    return replace(ws, enabled=False) if ws.enabled and spec is not None and not spec.warm_start else ws


def load_base(model_cfg: ModelConfig, seed: int):
    """The starting model: a fresh built-in (random weights) or a from_pretrained checkpoint."""
    if classify_model_ref(model_cfg.name) == "builtin":
        return build_builtin(model_cfg.name, seed)
    dtype = "auto" if model_cfg.dtype == "auto" else getattr(torch, model_cfg.dtype)
    return load_pretrained(model_cfg.name, trust_remote_code=model_cfg.trust_remote_code, dtype=dtype)


def dev_split(task: Task):
    """(the rows the warm start trains on, the dev split it is accepted on): the dev split is the last
    min(len(eval), len(train) // DEV_SHARE) rows of the train split (at least one), less any whose prompt is an
    eval prompt, so it is disjoint from the eval split even for data whose splits share prompts; the warm start
    trains on the rest. A task whose every row has one prompt (``guess``: the rows differ in their hidden
    answers) keeps those rows: no split of it can differ in prompts."""
    train = task.train
    n = max(1, min(len(task.eval), len(train) // DEV_SHARE))
    held = set(range(len(train) - n, len(train)))
    evals = set(task.eval["prompt"])
    dev = [i for i in sorted(held) if train[i]["prompt"] not in evals]
    if not dev and len(evals) == 1:  # one prompt for every row (guess): its rows differ in their answers only
        dev = sorted(held)
    rest = [i for i in range(len(train)) if i not in held]
    return train.select(rest), train.select(dev)


def greedy_pass1(model, tok, task: Task, n: int | None, max_new_tokens: int, batch: int = 512,
                 rows=None, episodes: Episodes | None = None) -> float:
    """Fraction of the first ``n`` prompts of ``rows`` (a split of ``task``; default its eval split; all when
    ``n`` is None) whose greedy completion verifies; with ``episodes`` (a multi-turn environment), the mean
    return of their greedy episodes."""
    rows = task.eval if rows is None else rows
    rows = rows if n is None else rows.select(range(min(n, len(rows))))
    was_training = model.training
    model.eval()
    hits = 0.0
    for i in range(0, len(rows), batch):
        chunk = rows.select(range(i, min(i + batch, len(rows))))
        if episodes is not None:
            trajs = play(episodes, tok, [{"prompt": p, "answer": a} for p, a in zip(chunk["prompt"], chunk["answer"])],
                         lambda ctx, idx, turn, m: generate("auto", model, tok, ctx, max_new_tokens=m, greedy=True),
                         max_new_tokens=max_new_tokens, eos=eos_ids(model, tok))
            hits += sum(t.reward for t in trajs)
            continue
        gen = generate("auto", model, tok, list(chunk["prompt"]), max_new_tokens=max_new_tokens, greedy=True)
        hits += sum(task.score(gen.texts, list(chunk["answer"]))[0])  # each call under the default time limit
    model.train(was_training)
    return hits / max(1, len(rows))


def sft_batch(tok, prompts: list[str], targets: list[str], device) -> dict:
    """Right-padded prompt+target+eos with labels on the completion only."""
    enc_p = tok(prompts, add_special_tokens=False)["input_ids"]
    enc_t = tok(targets, add_special_tokens=False)["input_ids"]
    seqs = [p + t + [tok.eos_token_id] for p, t in zip(enc_p, enc_t)]
    width = max(map(len, seqs))
    ids = torch.full((len(seqs), width), tok.pad_token_id, dtype=torch.long)
    labels = torch.full_like(ids, -100)
    attn = torch.zeros_like(ids)
    for i, (p, s) in enumerate(zip(enc_p, seqs)):
        ids[i, : len(s)] = torch.tensor(s)
        attn[i, : len(s)] = 1
        labels[i, len(p) : len(s)] = ids[i, len(p) : len(s)]
    return {"input_ids": ids.to(device), "attention_mask": attn.to(device), "labels": labels.to(device)}


def transcript_batch(tok, episodes: Episodes, rows: list[dict], device) -> dict:
    """The scripted solver's episodes on ``rows`` (``tasks.scripted``), right-padded, token in and token out as a
    rollout lays them out: the prompt, then each segment encoded on its own (an environment's answer cut to
    ``env.max_tool_tokens``), and an eos after a final answer (an episode that ends on a call ends at its
    marker); labels on the model's segments only, never on the prompt or the environment's."""
    seqs, labels = [], []
    for row in rows:
        env = episodes.make()
        segments, _ = scripted(env, row)
        ids = list(tok(row["prompt"], add_special_tokens=False)["input_ids"])
        lab = [-100] * len(ids)
        for who, text in segments:
            part = tok(text, add_special_tokens=False)["input_ids"]
            if who == "environment":
                part = part[:episodes.max_tool_tokens]
            ids += part
            lab += part if who == "model" else [-100] * len(part)
        if episodes.tools is None or episodes.tools.parse(env.tool, segments[-1][1]) is None:
            ids.append(tok.eos_token_id)
            lab.append(tok.eos_token_id)
        seqs.append(ids)
        labels.append(lab)
    width = max(map(len, seqs))
    out = {"input_ids": torch.full((len(seqs), width), tok.pad_token_id, dtype=torch.long),
           "attention_mask": torch.zeros((len(seqs), width), dtype=torch.long),
           "labels": torch.full((len(seqs), width), -100, dtype=torch.long)}
    for i, (ids, lab) in enumerate(zip(seqs, labels)):
        out["input_ids"][i, :len(ids)] = torch.tensor(ids)
        out["attention_mask"][i, :len(ids)] = 1
        out["labels"][i, :len(ids)] = torch.tensor(lab)
    return {k: v.to(device) for k, v in out.items()}


def finetune(model, tok, task: Task, ws: WarmStartConfig, seed: int, max_new_tokens: int,
             progress: bool = True, device: str | torch.device = "cpu",
             episodes: Episodes | None = None) -> tuple[float, int]:
    """Supervised steps until a check lands in [target, target + tolerance] (or ``max_steps``).

    A check past the band's top is undone: model and optimiser go back to the
    last check below the target and continue at ``lr * backoff`` (compounded),
    checking every third as many steps (down to every step); after
    ``max_backoffs`` of those the next check past the target is accepted.
    With ``episodes`` (a multi-turn environment) it trains on the scripted solver's transcripts
    (``transcript_batch``; on the data's ``target`` for an environment without a solver) and checks the greedy
    episodes' mean return.
    Returns (the last check's score, optimiser steps taken, undone ones included).
    """
    model.to(device).train()
    opt = torch.optim.AdamW(model.parameters(), lr=ws.lr, weight_decay=0.0)
    gen = torch.Generator().manual_seed(seed)
    sft, dev = dev_split(task)
    # a multi-turn environment with a scripted solver: its transcripts, whose environment tokens get no label
    transcripts = episodes is not None and hasattr(episodes.make(), "solver")
    score = greedy_pass1(model, tok, task, ws.eval_prompts, max_new_tokens, rows=dev, episodes=episodes)
    step = backoffs = since_check = 0
    every = ws.eval_every
    below = _snapshot(model, opt, score)  # the last state whose check was below the target
    cols = (TextColumn("warm start"), BarColumn(), TextColumn("{task.completed}/{task.total} pass@1={task.fields[p]:.2f}"),
            TimeElapsedColumn())
    with Progress(*cols, disable=not progress, transient=True) as bar:
        job = bar.add_task("ws", total=ws.max_steps, p=score)
        while score < ws.target_pass1 and step < ws.max_steps:
            idx = torch.randint(len(sft), (ws.batch_size,), generator=gen).tolist()
            rows = sft.select(idx)
            batch = (transcript_batch(tok, episodes, [dict(r) for r in rows], device) if transcripts else
                     sft_batch(tok, list(rows["prompt"]), list(rows["target"]), device))
            loss = model(**batch).loss
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            step += 1
            since_check += 1
            if since_check == every:
                since_check = 0
                score = greedy_pass1(model, tok, task, ws.eval_prompts, max_new_tokens, rows=dev, episodes=episodes)
                if score > ws.target_pass1 + ws.tolerance and backoffs < ws.max_backoffs:
                    # overshoot: undo the steps since the last check below the target; then smaller steps,
                    # checked more often (near the transition a few steps move greedy pass@1 by points)
                    backoffs += 1
                    _restore(model, opt, below)
                    for group in opt.param_groups:
                        group["lr"] = ws.lr * ws.backoff ** backoffs
                    every = max(1, every // 3)
                    score = below["score"]
                elif score < ws.target_pass1:
                    below = _snapshot(model, opt, score)
            bar.update(job, completed=step, p=score)
    model.eval()
    return score, step


def _snapshot(model, opt, score: float) -> dict:
    return {"model": copy.deepcopy(model.state_dict()), "opt": copy.deepcopy(opt.state_dict()), "score": score}


def _restore(model, opt, snap: dict) -> None:
    model.load_state_dict(snap["model"])
    opt.load_state_dict(snap["opt"])


def warm_start(task: Task, model_cfg: ModelConfig, ws: WarmStartConfig, seed: int, max_new_tokens: int,
               progress: bool = True, device: str | torch.device = "cpu", log=print,
               env: EnvConfig | None = None) -> WarmStart:
    """Return the cached warm-start checkpoint for this key, creating it if needed. ``env``: how a multi-turn
    task's episodes are played (default ``EnvConfig()``)."""
    ws = for_model(ws, model_cfg.name)
    env = env or EnvConfig()
    root = cache_dir() / "warmstart"
    path = root / cache_key(task, model_cfg, ws, seed, env)
    if (cached := _cached(path)) is not None:
        return cached
    locks = cache_dir() / "locks"
    locks.mkdir(parents=True, exist_ok=True)
    # one process fine-tunes, the others (the ranks of a torchrun job, parallel workers) wait and load it
    with FileLock(str(locks / f"warmstart-{path.name}.lock")):
        if (cached := _cached(path)) is not None:
            return cached
        return _fine_tune(task, model_cfg, ws, seed, max_new_tokens, progress, device, log, root, path, env)


def _cached(path: Path) -> WarmStart | None:
    meta_file = path / "warmstart.json"
    if not meta_file.is_file():
        return None
    meta = json.loads(meta_file.read_text())
    return WarmStart(path, meta["pass1"], meta["steps"], meta["seconds"], cached=True, dev_pass1=meta.get("dev_pass1"))


def _fine_tune(task, model_cfg, ws, seed, max_new_tokens, progress, device, log, root: Path, path: Path,
               env: EnvConfig) -> WarmStart:
    torch.manual_seed(seed)
    model, tok = load_base(model_cfg, seed)
    episodes = episodes_for(task, env, tok)
    t0 = time.perf_counter()
    steps, dev_pass1 = 0, None
    if ws.enabled:
        log(f"warm start: supervised fine-tune of {model_cfg.name} on {task.name} "
            f"until greedy pass@1 lands in [{ws.target_pass1:.0%}, {ws.target_pass1 + ws.tolerance:.0%}] "
            f"(at most {ws.max_steps} steps)")
        dev_pass1, steps = finetune(model, tok, task, ws, seed, max_new_tokens, progress, device, episodes)
    seconds = time.perf_counter() - t0
    pass1 = greedy_pass1(model, tok, task, len(task.eval), max_new_tokens, episodes=episodes)
    # write to a temp dir and rename, so concurrent workers never read a half-written checkpoint
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=root, prefix=".tmp-"))
    try:
        model.to("cpu").save_pretrained(tmp)
        tok.save_pretrained(tmp)
        meta = {"pass1": pass1, "steps": steps, "seconds": seconds, "task": task.name, "model": model_cfg.name,
                "seed": seed, "target_pass1": ws.target_pass1, "enabled": ws.enabled, "dev_pass1": dev_pass1,
                "dev_prompts": len(dev_split(task)[1])}
        (tmp / "warmstart.json").write_text(json.dumps(meta, indent=2))
    except BaseException:  # a signal or a full disk: leave no half-written folder behind
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    try:
        os.replace(tmp, path)
    except OSError:  # another worker won the race; theirs is equivalent
        shutil.rmtree(tmp, ignore_errors=True)
    dev = "" if dev_pass1 is None else f" (accepted at {dev_pass1:.1%} on {len(dev_split(task)[1])} dev prompts)"
    log(f"warm start: greedy pass@1 {pass1:.1%} on {len(task.eval)} held-out prompts after {steps} steps{dev} "
        f"({seconds:.0f}s) -> {path}")
    if ws.enabled and (dev_pass1 or 0.0) < ws.target_pass1:
        log(f"[warning] the warm start stopped at max_steps={ws.max_steps} below its target "
            f"{ws.target_pass1:.0%}: RL starts lower than the documented band (raise warmstart.max_steps or lr)")
    return WarmStart(path, pass1, steps, seconds, cached=False, dev_pass1=dev_pass1)


@dataclass
class BandRow:
    model: str
    seed: int
    pass1: float
    steps: int
    seconds: float
    cached: bool


def band(task_ref: str, models: list[str], seeds: list[int], ws: WarmStartConfig, progress: bool = False,
         log=print, options: TaskOptions | None = None) -> list[BandRow]:
    """Warm start (or load) every model x seed with the same config: where does greedy pass@1 land?"""
    from gspo_bench.tasks import load_task

    rows = []
    for model in models:
        for seed in seeds:
            task = load_task(task_ref, seed, ModelConfig(name=model), log=log, options=options)
            w = warm_start(task, ModelConfig(name=model), ws, seed, task.spec.max_new_tokens, progress, log=log)
            rows.append(BandRow(model, seed, w.pass1, w.steps, w.seconds, w.cached))
    return rows


def band_markdown(rows: list[BandRow], ws: WarmStartConfig, task: str, command: str, commit: str) -> str:
    """The band table: one row per model x seed, then min / mean / max per model."""
    out = [f"# Warm-start band: {task}, target greedy pass@1 {ws.target_pass1:.0%}", "",
           f"Command: `{command}`  ", f"Commit: `{commit}`", "",
           f"Stop rule: greedy pass@1 on the whole eval split, checked every {ws.eval_every} steps; stop at the "
           f"first check in [{ws.target_pass1:.0%}, {ws.target_pass1 + ws.tolerance:.0%}]; a check above it is "
           f"undone (back to the last check below the target, lr x {ws.backoff:g} and checks 3x as often, at most "
           f"{ws.max_backoffs} times); at most {ws.max_steps} steps.", ""]
    out.append(tables.markdown(("model", "seed", "greedy pass@1", "steps", "seconds"),
                               [[r.model, r.seed, f"{r.pass1:.1%}", r.steps, f"{r.seconds:.0f}"] for r in rows]))
    per_model = []
    for model in dict.fromkeys(r.model for r in rows):
        ps = [r.pass1 for r in rows if r.model == model]
        per_model.append([model, len(ps), f"{min(ps):.1%}", f"{sum(ps) / len(ps):.1%}", f"{max(ps):.1%}",
                          sum(p < ws.target_pass1 for p in ps)])
    out.append(tables.markdown(("model", "seeds", "min", "mean", "max", "below target"), per_model))
    return "\n".join(out)
