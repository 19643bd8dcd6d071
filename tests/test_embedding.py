"""``core/embedding.py``: the tied embedding's lookup whose gradient is the rows read, checked by hand and
against ``F.embedding`` bit for bit, through a tied LM head."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from gspo_bench.core.embedding import tied_lookup


def test_the_gradient_is_the_rows_read_summed_with_the_padding_row_left_out():
    w = torch.zeros(5, 2, requires_grad=True)
    ids = torch.tensor([1, 3, 1, 0])
    x = tied_lookup(ids, w, padding_idx=3)
    assert torch.equal(x, w.detach()[ids])
    x.backward(torch.tensor([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0], [7.0, 8.0]]))
    assert w.grad.is_sparse
    # row 1 read twice: (1, 2) + (5, 6); row 0 once; row 3 is the padding row: nothing; rows 2 and 4 unread
    expected = torch.tensor([[7.0, 8.0], [6.0, 8.0], [0.0, 0.0], [0.0, 0.0], [0.0, 0.0]])
    assert torch.equal(w.grad.to_dense(), expected)
    assert w.grad.coalesce().indices().tolist() == [[0, 1, 3]]  # only the rows read are stored


def test_through_a_tied_head_the_weight_s_gradient_is_dense_and_bit_for_bit_f_embedding_s():
    torch.manual_seed(0)
    V, H, N = 300, 16, 200
    weight = torch.nn.Parameter(torch.randn(V, H))
    ids = torch.randint(0, 40, (N,))  # most rows read many times: the order of their sums matters
    ids[:5] = 7  # the padding row, read too
    hidden = torch.randn(N, H)
    grads = []
    for lookup in (lambda: F.embedding(ids, weight, padding_idx=7), lambda: tied_lookup(ids, weight, 7)):
        weight.grad = None
        for _ in range(2):  # two backwards: the second adds into the first's gradient, as micro-batches do
            x = lookup()
            logits = torch.tanh(x + hidden) @ weight.t()  # the head is the embedding
            (torch.logsumexp(logits, -1).sum() + (x * x).sum()).backward()
        grads.append(weight.grad.clone())
    dense, rows = grads
    assert not rows.is_sparse and torch.equal(rows, dense)


def test_without_a_gradient_it_is_a_plain_lookup():
    w = torch.randn(4, 3, requires_grad=True)
    with torch.no_grad():
        x = tied_lookup(torch.tensor([2, 2]), w)
    assert x.grad_fn is None and torch.equal(x, w.detach()[[2, 2]])
