"""core/accumulate.py: the weight gradient added into the kept ``.grad`` by the matmul, by hand."""

import pytest
import torch
import torch.nn.functional as F

from gspo_bench.core.accumulate import accumulating_experts_linear, accumulating_linear
from gspo_bench.core.embedding import tied_lookup
from gspo_bench.core.lm_head import token_logp_entropy


def _leaf(*shape, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g, dtype=torch.float64).requires_grad_()


def test_the_forward_is_f_linear_and_the_gradient_goes_into_the_kept_grad_in_place():
    x, w, b = _leaf(5, 3, seed=0), _leaf(4, 3, seed=1), _leaf(4, seed=2)
    g = torch.randn(5, 4, dtype=torch.float64)
    kept_w, kept_b = torch.randn(4, 3, dtype=torch.float64), torch.randn(4, dtype=torch.float64)
    w.grad, b.grad = kept_w.clone(), kept_b.clone()
    where = w.grad.data_ptr(), b.grad.data_ptr()
    y = accumulating_linear(x, w, b)
    torch.testing.assert_close(y, x @ w.T + b, rtol=0, atol=1e-12)
    y.backward(g)
    # grad x = g W; W.grad = kept + g^T x; b.grad = kept + sum over rows of g
    torch.testing.assert_close(x.grad, g @ w.detach(), rtol=0, atol=1e-12)
    torch.testing.assert_close(w.grad, kept_w + g.T @ x.detach(), rtol=0, atol=1e-12)
    torch.testing.assert_close(b.grad, kept_b + g.sum(0), rtol=0, atol=1e-12)
    assert (w.grad.data_ptr(), b.grad.data_ptr()) == where  # added in place: no new tensor took their place


def test_without_a_kept_grad_the_gradient_is_f_linears():
    x, w = _leaf(6, 3, seed=3), _leaf(2, 3, seed=4)
    x2, w2 = x.detach().clone().requires_grad_(), w.detach().clone().requires_grad_()
    g = torch.randn(6, 2, dtype=torch.float64)
    accumulating_linear(x, w).backward(g)
    F.linear(x2, w2).backward(g)
    assert torch.equal(w.grad, w2.grad) and torch.equal(x.grad, x2.grad)


def test_two_parts_accumulate_to_one_pass_over_both():
    x = torch.randn(8, 3, dtype=torch.float64)
    w, whole = _leaf(4, 3, seed=5), _leaf(4, 3, seed=5)
    g = torch.randn(8, 4, dtype=torch.float64)
    F.linear(x[:5], w).backward(g[:5])  # the first part: autograd's own
    accumulating_linear(x[5:], w).backward(g[5:])
    F.linear(x, whole).backward(g)
    torch.testing.assert_close(w.grad, whole.grad, rtol=1e-12, atol=1e-12)


def test_a_tied_head_and_lookup_accumulate_without_copying_the_weights_gradient():
    """The lookup's sparse rows meet the head's gradient in the kept .grad: after the second part the grad is
    the one tensor it was, holding both parts' head and lookup gradients."""
    V, H = 11, 4
    w, ref = _leaf(V, H, seed=6), _leaf(V, H, seed=6)
    ids = [torch.tensor([1, 3, 3, 7]), torch.tensor([3, 9, 0])]
    for k, part in enumerate(ids):
        for weight, linear in ((w, accumulating_linear if k else F.linear), (ref, F.linear)):
            h = torch.tanh(tied_lookup(part, weight))
            linear(h, weight).square().sum().backward()
        if k == 0:
            where = w.grad.data_ptr()
    assert w.grad.data_ptr() == where and w.grad.layout == torch.strided
    torch.testing.assert_close(w.grad, ref.grad, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("chunk", [0, 2])
def test_the_lm_head_accumulates_into_the_kept_grad(chunk):
    N, V, H = 5, 7, 3
    h = torch.randn(N, H, dtype=torch.float32)
    target = torch.randint(0, V, (N,))
    w, ref = (torch.randn(V, H, generator=torch.Generator().manual_seed(8)).requires_grad_() for _ in range(2))
    kept = torch.randn(V, H)
    w.grad, ref.grad = kept.clone(), kept.clone()
    where = w.grad.data_ptr()
    lp, _ = token_logp_entropy(h, w, None, target, 0.7, chunk, accumulate=True)
    lp_ref, _ = token_logp_entropy(h, ref, None, target, 0.7, chunk)
    assert torch.equal(lp, lp_ref)
    lp.sum().backward()
    lp_ref.sum().backward()
    assert w.grad.data_ptr() == where
    torch.testing.assert_close(w.grad, ref.grad, rtol=1e-6, atol=1e-6)


def test_plain_f_linear_where_nothing_is_recorded():
    x, w = torch.randn(3, 2), torch.randn(4, 2, requires_grad=True)
    with torch.no_grad():
        assert accumulating_linear(x, w).grad_fn is None
    assert accumulating_linear(x, w.detach()).grad_fn is None
    assert "Accumulating" in type(accumulating_linear(x, w).grad_fn).__name__


def test_under_autocast_the_products_run_in_its_dtype_and_add_into_the_float32_grad():
    """bf16-mixed: the same output and gradients as autocast's own linear, to the bit (the product in
    bfloat16, then added in float32), into the float32 .grad already there."""
    x, w, b = (torch.randn(*s, generator=torch.Generator().manual_seed(k)) for k, s in
               enumerate(((6, 8), (5, 8), (5,))))
    g = torch.randn(6, 5).to(torch.bfloat16)
    kept = torch.randn(5, 8), torch.randn(5)
    outs = {}
    for name, linear in (("fused", accumulating_linear), ("autocast", F.linear)):
        xs, ws, bs = x.clone().requires_grad_(), w.clone().requires_grad_(), b.clone().requires_grad_()
        ws.grad, bs.grad = kept[0].clone(), kept[1].clone()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            y = linear(xs, ws, bs)
        y.backward(g)
        outs[name] = (y, xs.grad, ws.grad, bs.grad)
    for got, want in zip(outs["fused"], outs["autocast"]):
        assert got.dtype == want.dtype and torch.equal(got, want)
    assert outs["fused"][0].dtype == torch.bfloat16 and outs["fused"][2].dtype == torch.float32


# experts: 3 experts of (out 8, in 4) on 10 rows sorted by expert, 4 / 0 / 6 of them (the middle one idle); float32,
# grouped_mm's widest dtype on a CPU, rows of 16 bytes or more as it needs


def _leaf32(*shape, seed):
    return _leaf(*shape, seed=seed).float().detach().requires_grad_()


OFFS = torch.tensor([4, 4, 10], dtype=torch.int32)
SPANS = ((0, 0, 4), (2, 4, 10))  # (expert, first row, end) of the experts with rows


def test_each_experts_gradient_goes_into_its_slice_of_the_kept_grad_and_an_idle_expert_s_is_untouched():
    x, w = _leaf32(10, 4, seed=10), _leaf32(3, 8, 4, seed=11)
    g = torch.randn(10, 8, generator=torch.Generator().manual_seed(12))
    kept = torch.randn(3, 8, 4)
    w.grad = kept.clone()
    where = w.grad.data_ptr()
    y = accumulating_experts_linear(x, w, OFFS, torch.float32)
    for e, a, b in SPANS:
        # y_e = x_e W_e^T
        torch.testing.assert_close(y[a:b], x[a:b] @ w[e].T, rtol=1e-6, atol=1e-6)
    y.backward(g)
    for e, a, b in SPANS:
        # grad x_e = g_e W_e; W_e.grad = kept_e + g_e^T x_e
        torch.testing.assert_close(x.grad[a:b], g[a:b] @ w.detach()[e], rtol=1e-6, atol=1e-6)
        torch.testing.assert_close(w.grad[e], kept[e] + g[a:b].T @ x.detach()[a:b], rtol=1e-6, atol=1e-6)
    assert torch.equal(w.grad[1], kept[1]) and w.grad.data_ptr() == where  # in place; the idle expert: nothing


def test_experts_without_a_kept_grad_get_autograds_grouped_gradient_to_the_bit():
    x, w = _leaf32(10, 4, seed=13), _leaf32(3, 8, 4, seed=14)
    x2, w2 = x.detach().clone().requires_grad_(), w.detach().clone().requires_grad_()
    g = torch.randn(10, 8)
    accumulating_experts_linear(x, w, OFFS, torch.float32).backward(g)
    F.grouped_mm(x2, w2.transpose(1, 2), offs=OFFS).backward(g)
    assert torch.equal(x.grad, x2.grad) and torch.equal(w.grad, w2.grad)
    assert not bool(w.grad[1].any())  # the idle expert's gradient: zeros


def test_experts_under_a_lower_dtype_add_its_product_into_the_float32_grad():
    """bf16-mixed: the experts run in bfloat16 (grouped_mm does not autocast; the kernel casts), and the second
    part's bfloat16 products land in the float32 .grad, as the cast's backward would add them."""
    x = torch.randn(10, 8, generator=torch.Generator().manual_seed(15))
    g = torch.randn(10, 16, generator=torch.Generator().manual_seed(16)).to(torch.bfloat16)
    kept = torch.randn(3, 16, 8)
    outs = {}
    for name in ("fused", "autograd"):
        xs, ws = x.clone().requires_grad_(), torch.randn(3, 16, 8, generator=torch.Generator().manual_seed(17))
        ws.requires_grad_().grad = kept.clone()
        if name == "fused":
            y = accumulating_experts_linear(xs, ws, OFFS, torch.bfloat16)
        else:
            y = F.grouped_mm(xs.to(torch.bfloat16), ws.to(torch.bfloat16).transpose(1, 2), offs=OFFS)
        y.backward(g)
        outs[name] = (y, xs.grad, ws.grad)
    for got, want in zip(outs["fused"], outs["autograd"]):
        assert got.dtype == want.dtype
        torch.testing.assert_close(got, want, rtol=0, atol=0)
    assert outs["fused"][0].dtype == torch.bfloat16 and outs["fused"][2].dtype == torch.float32


def test_experts_record_nothing_where_no_gradient_is_taken():
    x, w = _leaf32(10, 4, seed=18), _leaf32(3, 8, 4, seed=19)
    with torch.no_grad():
        assert accumulating_experts_linear(x, w, OFFS, torch.float32).grad_fn is None
    assert "Accumulating" in type(accumulating_experts_linear(x, w, OFFS, torch.float32).grad_fn).__name__


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_on_a_gpu_two_parts_accumulate_to_one_pass_under_bf16_autocast():
    x = torch.randn(64, 32, device="cuda")
    g = torch.randn(64, 16, device="cuda", dtype=torch.bfloat16)
    w, ref = (torch.randn(16, 32, device="cuda", generator=torch.Generator("cuda").manual_seed(3))
              .requires_grad_() for _ in range(2))
    for weight, second in ((w, accumulating_linear), (ref, F.linear)):
        for k, linear in enumerate((F.linear, second)):
            with torch.autocast("cuda", dtype=torch.bfloat16):
                y = linear(x[32 * k:32 * (k + 1)], weight)
            y.backward(g[32 * k:32 * (k + 1)])
    assert w.grad.dtype == torch.float32 and torch.equal(w.grad, ref.grad)
