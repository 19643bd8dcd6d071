"""Routing Replay (R2, R3) and the sampler's precision: recorded experts are replayed exactly, gates still learn."""

from __future__ import annotations

import warnings

import pytest
import torch

from gspo_bench.models import build_builtin
from gspo_bench.rollout.producer import merge_generations, select
from gspo_bench.rollout.engine import fast_generate, hf_generate, response_logp
from gspo_bench.rollout.precision import SamplerWeights
from gspo_bench.rollout.routing import (GridLayout, RouterHooks, empty_grid, replayed_gate, routers,
                                        routing_mismatch)
from tests.conftest import sharpen

PROMPTS = ["12+3=", "7+45=", "1+1=", "30+62=", "5+5=", "88+1="]


@pytest.fixture(scope="module")
def moe():
    model, tok = build_builtin("tiny-moe", 0)
    return sharpen(model).eval(), tok


class Used:
    """Forward hooks registered after ``RouterHooks``: the experts each router's caller really received."""

    def __init__(self, model):
        self.gates, self.seen = routers(model), []

    def __enter__(self):
        self.handles = [g.register_forward_hook(lambda m, a, out: self.seen.append(out[2].detach()))
                        for g in self.gates]
        return self

    def __exit__(self, *exc):
        for h in self.handles:
            h.remove()

    def grid(self, attn, rows=None, packed=True) -> torch.Tensor:
        """The used experts of the last forward, back on the (layers, B, W, k) grid."""
        L = len(self.gates)
        grid = torch.full((L, *attn.shape, self.gates[0].top_k), -1, dtype=torch.int16)
        GridLayout(attn, None, packed).scatter(grid, torch.stack(self.seen[-L:]))
        return grid


def sample(model, tok, engine, dtype="float32", seed=0):
    sampler = SamplerWeights(dtype)(model)
    gen = (fast_generate if engine == "fast" else hf_generate)(
        sampler, tok, PROMPTS * 2, max_new_tokens=6, record_routes=True,
        **({"generator": torch.Generator().manual_seed(seed)} if engine == "fast" else {}))
    return gen


def trainer_routes(model, gen, packed: bool, replay=None):
    """Run the training forward (packed or transformers) over the rollout; return (used, natural) grids."""
    natural = empty_grid(model, *gen.input_ids.shape)
    layout = GridLayout(gen.attention_mask, None, packed)
    with RouterHooks(model) as hooks, Used(model) as used:
        hooks.replay = None if replay is None else layout.gather(replay)
        response_logp(model, gen.input_ids, gen.attention_mask, gen.prompt_len, forward="packed" if packed else "hf")
        layout.scatter(natural, hooks.take())
    return used.grid(gen.attention_mask, packed=packed), natural


@pytest.mark.parametrize("engine", ["fast", "hf"])
def test_fp32_sampler_records_the_trainers_own_routes(moe, engine):
    # same weights, same precision: the routes the engine recorded token by token (KV cache, row compaction)
    # are the ones a full forward over the finished rollout picks, so the grid columns line up
    model, tok = moe
    torch.manual_seed(0)
    gen = sample(model, tok, engine)
    assert gen.routes is not None and gen.routes.dtype == torch.int8
    assert gen.routes.shape == (len(routers(model)), *gen.input_ids.shape, 2)
    real = gen.attention_mask.bool()
    assert (gen.routes[:, ~real] == -1).all()  # padding and after-eos cells are not recorded
    recorded = gen.routes[..., 0] >= 0
    # every real cell is recorded, except perhaps each row's last token (fed back only if other rows go on)
    assert real.sum() - real.shape[0] <= recorded.any(0).sum() <= real.sum()
    _, natural = trainer_routes(model, gen, packed=True)
    assert float(routing_mismatch(gen.routes, natural, real)) < 0.005


@pytest.mark.parametrize("packed", [True, False], ids=["packed", "transformers"])
def test_replay_forces_the_recorded_experts_exactly(moe, packed):
    model, tok = moe
    torch.manual_seed(1)
    gen = sample(model, tok, "fast", dtype="bfloat16")
    # perturb the router, as an update would: now the trainer's own routes differ from the sampler's
    policy = build_builtin("tiny-moe", 0)[0]
    policy.load_state_dict(model.state_dict())
    with torch.no_grad():
        for g in routers(policy):
            g.weight.add_(0.5 * torch.randn(g.weight.shape, generator=torch.Generator().manual_seed(3)))
    real = gen.attention_mask.bool()
    used, natural = trainer_routes(policy, gen, packed)
    recorded = (gen.routes[..., 0] >= 0) & real[None]
    assert float(routing_mismatch(gen.routes, natural, real)) > 0.05  # without replay they differ
    used, natural2 = trainer_routes(policy, gen, packed, replay=gen.routes)
    # with replay the forward used exactly the recorded experts on every recorded cell ...
    assert torch.equal(used[recorded].long(), gen.routes[recorded].long())
    # ... and the router's own choices are still reported: layer 0 sees the same input either way (later
    # layers see hidden states the replayed experts produced)
    assert torch.equal(natural2[0][recorded[0]], natural[0][recorded[0]])


def test_bf16_sampler_routes_differ_from_fp32_trainer(moe):
    model, tok = moe
    torch.manual_seed(2)
    gen = sample(model, tok, "fast", dtype="bfloat16")
    _, natural = trainer_routes(model, gen, packed=True)
    # same weights, only the sampler's precision differs: some choices flip, most do not
    mism = float(routing_mismatch(gen.routes, natural, gen.attention_mask.bool()))
    assert 0.0 < mism < 0.5


def test_router_gets_a_gradient_under_replay(moe):
    model, tok = moe
    torch.manual_seed(3)
    gen = sample(model, tok, "fast", dtype="bfloat16")
    policy = build_builtin("tiny-moe", 0)[0]
    policy.load_state_dict(model.state_dict())
    layout = GridLayout(gen.attention_mask, None, True)
    with RouterHooks(policy) as hooks:
        hooks.replay = layout.gather(gen.routes)
        logp, _ = response_logp(policy, gen.input_ids, gen.attention_mask, gen.prompt_len, forward="packed")
    logp.sum().backward()
    for g in routers(policy):
        assert g.weight.grad is not None and g.weight.grad.abs().sum() > 0


def test_replayed_gate_weights_by_hand():
    class Router:
        norm_topk_prob = True

    logits = torch.tensor([[2.0, 0.0, 1.0, -1.0]], requires_grad=True)
    natural = torch.tensor([[0, 2]])
    replay = torch.tensor([[1, -1]], dtype=torch.int8)
    w, chosen = replayed_gate(Router(), logits, natural, replay)
    assert chosen.tolist() == [[1, 2]]  # slot 0 replayed, slot 1 (-1) keeps the router's own
    p = torch.softmax(logits.detach(), -1)[0]
    # w = p_chosen / sum(p_chosen)
    expect = torch.stack([p[1], p[2]]) / (p[1] + p[2])
    torch.testing.assert_close(w[0], expect)
    w[0, 0].backward()
    # d w_0 / d z_j for w_0 = e^{z1} / (e^{z1} + e^{z2}): w0 (1 - w0) at j=1, -w0 w1 at j=2, 0 elsewhere
    w0, w1 = float(expect[0]), float(expect[1])
    torch.testing.assert_close(logits.grad[0], torch.tensor([0.0, w0 * (1 - w0), -w0 * w1, 0.0]))


def test_select_and_merge_keep_routes_on_their_tokens(moe):
    model, tok = moe
    torch.manual_seed(4)
    short = fast_generate(model, tok, ["1+1="] * 2, max_new_tokens=3, record_routes=True)
    long = fast_generate(model, tok, ["30+62="] * 2, max_new_tokens=6, record_routes=True)
    merged = merge_generations([short, long], tok.pad_token_id)
    assert merged.routes.shape[2] == merged.input_ids.shape[1]
    P = merged.prompt_len
    # the short batch's prompt moved right by the prompt-length difference, its responses stay at column P
    lp = P - short.prompt_len
    torch.testing.assert_close(merged.routes[:, :2, lp:lp + short.input_ids.shape[1]], short.routes, rtol=0, atol=0)
    assert (merged.routes[:, :2, :lp] == -1).all()
    picked = select(merged, torch.tensor([3, 0]))
    assert torch.equal(picked.routes[:, 0], merged.routes[:, 3]) and torch.equal(picked.routes[:, 1], merged.routes[:, 0])


def test_sampler_copy_is_refreshed_after_an_update():
    model, _ = build_builtin("tiny-dense", 0)
    sampler = SamplerWeights("bfloat16")
    first = sampler(model)
    assert first is not model and next(first.parameters()).dtype == torch.bfloat16
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for p in model.parameters():
        p.grad = torch.ones_like(p)
    opt.step()
    again = sampler(model)
    assert again is first and sampler.refreshes == 2  # one copy, refreshed in place
    for ps, p in zip(again.parameters(), model.parameters()):
        assert torch.equal(ps, p.detach().to(torch.bfloat16))
    assert SamplerWeights("float32")(model) is model  # same dtype: the policy itself, no copy
    with pytest.raises(ValueError, match="allowed: float32, bfloat16, float16"):
        SamplerWeights("int8")


def test_dense_model_warns_and_ignores_replay(mixed_task, tracking_uri):
    from gspo_bench.config import load_config
    from gspo_bench.train.runner import run
    from tests.conftest import tiny_overrides

    def one(replay):
        cfg = load_config("smoke", overrides={**tiny_overrides(mixed_task, tracking_uri), "algos": ["grpo"],
                                              "moe": {"routing_replay": replay},
                                              "tracking": {"tracking_uri": tracking_uri, "experiment": "dense-rr"}})
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            [res] = run(cfg, log=lambda *a: None, keep_modules=True)
        assert res.status == "FINISHED", res.error
        return res, [str(w.message) for w in caught]

    base, _ = one("none")
    replayed, msgs = one("r3")
    assert any("routing_replay=r3 applies to mixture-of-experts models" in m for m in msgs)
    assert replayed.module.replay == "none"
    # nothing changed: same parameters after the same steps
    for a, b in zip(base.module.policy.parameters(), replayed.module.policy.parameters()):
        assert torch.equal(a, b)


def test_stale_sampler_is_the_policy_k_rollouts_ago():
    model, _ = build_builtin("tiny-dense", 0)
    sampler = SamplerWeights("float32", staleness=2)
    seen = []
    for step in range(4):
        with torch.no_grad():
            model.lm_head.weight.fill_(float(step))  # the policy after `step` updates
        seen.append(float(sampler(model).lm_head.weight[0, 0]))
    # rollouts 0 and 1 use the oldest policy there is, then always the one 2 rollouts back
    assert seen == [0.0, 0.0, 0.0, 1.0]
    assert sampler(model) is sampler.copy and sampler.copy is not model
    with pytest.raises(ValueError, match="staleness must be an int >= 0"):
        SamplerWeights("float32", staleness=-1)


# -- activation checkpointing: the backward's recomputation keeps the forward's experts ----------------------------
def random_routes(model, shape, seed: int) -> torch.Tensor:
    """A routes grid of distinct random experts per cell: almost never the router's own choice."""
    grid = empty_grid(model, *shape)
    g = torch.Generator().manual_seed(seed)
    picks = torch.stack([torch.randperm(8, generator=g)[:2] for _ in range(grid[..., 0].numel())])
    return picks.view(grid.shape).to(grid.dtype)


@pytest.mark.parametrize("packed", [True, False], ids=["packed", "transformers"])
def test_checkpointed_replay_has_the_gradient_of_the_replayed_forward(packed):
    """The recomputation runs after ``RouterHooks``' context closed: ``pinned_routes`` puts the replayed experts
    back, so the gradients equal those without checkpointing, whether the backward runs outside the context
    (as the RL step does) or inside it; the router's own choices would give another gradient."""
    model, tok = build_builtin("tiny-moe", 3)
    model = sharpen(model).train()
    gen = sample(model, tok, "fast")
    replay = random_routes(model, gen.input_ids.shape, 0)
    layout = GridLayout(gen.attention_mask, None, packed)
    fwd = "packed" if packed else "hf"

    def grads(checkpoint: bool | str, backward_inside: bool = False, routes=replay):
        model.zero_grad(set_to_none=True)
        with RouterHooks(model) as hooks:
            hooks.replay = None if routes is None else layout.gather(routes)
            logp, _ = response_logp(model, gen.input_ids, gen.attention_mask, gen.prompt_len, forward=fwd,
                                    checkpoint_layers=checkpoint)
            natural = hooks.take()
            if backward_inside:
                logp.sum().backward()
        if not backward_inside:
            logp.sum().backward()
        return natural, [p.grad.clone() for p in model.parameters()]

    natural, want = grads(False)
    for mode, inside in ((True, False), (True, True), ("selective", False)):
        natural_ck, got = grads(mode, inside)
        assert torch.equal(natural_ck, natural)  # what the forward records is unchanged
        for a, b in zip(got, want):
            torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)
    _, own = grads(False, routes=None)
    assert max((a - b).abs().max().item() for a, b in zip(own, want)) > 1e-3
    # transformers' checkpointing is on only inside the call (each module's flag, under either version's name)
    assert not any(getattr(m, "gradient_checkpointing", False) for m in model.modules())
