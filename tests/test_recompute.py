"""What activation checkpointing runs again in the backward (gspo_bench.rollout.recompute).

The gradients of every mode against none are checked where each forward lives (``test_fastlm.py``,
``test_engine.py``, ``test_routing.py`` with MoE routes replayed); here, which operators run twice."""

from __future__ import annotations

import collections

import pytest
from torch.utils._python_dispatch import TorchDispatchMode

from gspo_bench.config import ConfigError, load_config
from gspo_bench.models import build_builtin
from gspo_bench.rollout import fastlm
from gspo_bench.rollout.engine import forward_response
from gspo_bench.rollout.recompute import SAVED_OPS, layer_context
from tests.conftest import sharpen
from tests.test_fastlm import PROMPT_LENS, RESP_LENS, T, ragged_batch


class OpCounter(TorchDispatchMode):
    """Counts every operator that reaches the kernels under it, forward and backward."""

    def __init__(self):
        super().__init__()
        self.counts = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.counts[func] += 1
        return func(*args, **(kwargs or {}))


def op_counts(model, forward) -> tuple[collections.Counter, collections.Counter]:
    """(operators of the forward, operators of the backward) of sum(log-probs) for ``forward``."""
    model.zero_grad(set_to_none=True)
    with OpCounter() as fwd:
        logp = forward()
    with OpCounter() as bwd:
        logp.sum().backward()
    return fwd.counts, bwd.counts


def products(counts: collections.Counter) -> int:
    return sum(n for op, n in counts.items() if op in SAVED_OPS)


FORWARDS = {
    "packed": lambda model, ids, attn, P, mode: fastlm.packed_response_logp(
        model, ids, attn, P, 0.7, share_prompts=True, logit_chunk_tokens=0, checkpoint_layers=mode)[0],
    "transformers": lambda model, ids, attn, P, mode: forward_response(
        model, ids, attn, P, 0.7, logit_chunk_tokens=0, checkpoint_layers=mode)[0],
}


@pytest.mark.parametrize("forward", list(FORWARDS))
@pytest.mark.parametrize("name", ["tiny-dense", "tiny-moe"])
def test_selective_runs_no_matrix_product_again_and_full_runs_every_layer_s_again(name, forward):
    """The backward's kernels by mode: ``true`` runs each layer's forward again, its matrix products included;
    ``selective`` takes the products from the forward (not one more than without checkpointing) and runs the
    operators between them again; both against the same forward."""
    model, _ = build_builtin(name, 4)
    model = sharpen(model).train()
    ids, attn, P = ragged_batch(21, PROMPT_LENS, RESP_LENS, T)
    run = FORWARDS[forward]
    fwd, bwd = {}, {}
    for mode in (False, True, "selective"):
        fwd[mode], bwd[mode] = op_counts(model, lambda: run(model, ids, attn, P, mode))
    # the forwards compute the same products whatever the mode
    assert products(fwd[False]) == products(fwd[True]) == products(fwd["selective"]) > 0
    # full checkpointing runs the layers' products again: each layer's attention and its projections up to the
    # last one whose output its backward reads (the recomputation stops there; the LM head's is not in a layer)
    layers = model.config.num_hidden_layers
    assert products(bwd[True]) - products(bwd[False]) >= 2 * layers
    assert products(bwd["selective"]) == products(bwd[False])
    # selective still runs the cheap operators again: its backward has more kernels than no checkpointing's
    assert sum(bwd["selective"].values()) > sum(bwd[False].values())
    assert sum(bwd["selective"].values()) < sum(bwd[True].values())


def test_layer_context_enters_every_context_given_and_refuses_an_unknown_mode():
    seen = []

    def pair():
        class Note:
            def __init__(self, tag):
                self.tag = tag

            def __enter__(self):
                seen.append(self.tag)

            def __exit__(self, *exc):
                seen.append("/" + self.tag)

        return Note("forward"), Note("recompute")

    fwd, rec = layer_context(True, pair, pair)()
    with fwd:
        pass
    with rec:
        pass
    assert seen == ["forward", "forward", "/forward", "/forward", "recompute", "recompute", "/recompute", "/recompute"]
    for bad in (1, "partial", None):
        with pytest.raises(ValueError, match="not a mode"):
            layer_context(bad)


@pytest.mark.parametrize("value, ok", [(False, True), (True, True), ("selective", True), (1, False),
                                       ("full", False)])
def test_train_activation_checkpointing_takes_the_three_modes(value, ok):
    overrides = {"train": {"activation_checkpointing": value}}
    if ok:
        assert load_config("smoke", overrides=overrides).train.activation_checkpointing == value
    else:
        with pytest.raises(ConfigError, match="train.activation_checkpointing=.*allowed: false, true, selective"):
            load_config("smoke", overrides=overrides)
