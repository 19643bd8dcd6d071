"""PPO's own parts: the critic trains, the reference stays frozen, the KL lands in the reward."""

from __future__ import annotations

import torch
from transformers import AutoModelForCausalLM

from gspo_bench.config import load_config
from gspo_bench.models import build_builtin
from gspo_bench.algorithms.ppo import Critic
from gspo_bench.train.runner import run
from tests.conftest import tiny_overrides


def test_critic_values_one_per_response_token(tmp_path):
    model, tok = build_builtin("tiny-dense", 0)
    model.save_pretrained(tmp_path)
    critic = Critic(str(tmp_path))
    ids = torch.tensor([[0, 4, 75, 5, 83, 6, 2], [4, 5, 75, 6, 83, 7, 2]])
    v = critic(ids, torch.ones_like(ids), prompt_len=5)
    assert v.shape == (2, 2)
    # the head starts at zero, so the first values are exactly 0 (no arbitrary baseline)
    assert torch.equal(v, torch.zeros(2, 2))


def test_packed_critic_equals_the_transformers_critic_in_value_and_gradient(tmp_path):
    from tests.test_fastlm import grouped_batch

    model, _ = build_builtin("tiny-dense", 3)
    model.save_pretrained(tmp_path)
    packed, hf = Critic(str(tmp_path), forward="packed"), Critic(str(tmp_path), forward="hf")
    assert packed.packed and not hf.packed
    for c in (packed, hf):
        torch.manual_seed(0)
        torch.nn.init.normal_(c.head.weight)  # a nonzero head, so the trunk's gradient is not zero
    ids, attn, P = grouped_batch(9)
    mask = attn[:, P:].float()
    grads = []
    for c in (packed, hf):
        v = c(ids, attn, P)
        ((v * mask) ** 2).sum().backward()
        grads.append({n: p.grad.clone() for n, p in c.named_parameters()})
        vals = v.detach() * mask
        if c is packed:
            first = vals
            assert (v.detach()[mask == 0] == 0).all()
    torch.testing.assert_close(first, vals, atol=1e-5, rtol=1e-5)
    assert first.abs().min() >= 0 and first[mask == 1].abs().min() > 0
    for n, g in grads[1].items():
        assert (grads[0][n] - g).abs().max() <= 1e-4 * g.abs().max() + 1e-7, n


def test_ppo_trains_critic_and_keeps_reference_frozen(mixed_task, tracking_uri):
    cfg = load_config("smoke", overrides={**tiny_overrides(mixed_task, tracking_uri), "algos": ["ppo"],
                                          "tracking": {"tracking_uri": tracking_uri, "experiment": "ppo-parts"}})
    [res] = run(cfg, log=lambda *a: None, keep_modules=True)
    assert res.status == "FINISHED", res.error
    m = res.module
    assert m.settings.loss.kl_coef == 0.05 and m.ref is not None
    start = AutoModelForCausalLM.from_pretrained(m.trainer.datamodule.tokenizer.name_or_path)
    for p, q in zip(m.ref.parameters(), start.parameters()):
        assert torch.equal(p.cpu(), q)
    assert m.critic.head.weight.abs().sum() > 0  # moved off its zero init
    assert res.last["critic/value_loss"] > 0 and "critic/ref_kl" in res.last
    assert res.last["critic/explained_var"] <= 1.0  # 1 - Var[R - V] / Var[R]
