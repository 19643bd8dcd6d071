"""Where the samplers' random draws come from (gspo_bench.rollout.draws), and that engines draw only from them."""

from __future__ import annotations

import pytest
import torch

from gspo_bench.config import ConfigError, RolloutConfig
from gspo_bench.models import build_builtin
from gspo_bench.rollout.draws import GlobalDraws, RequestDraws, StreamDraws, request_seed
from gspo_bench.rollout.engine import fast_generate, hf_generate
from gspo_bench.rollout.fastgen import sample


@pytest.fixture(scope="module")
def policy():
    model, tok = build_builtin("tiny-dense", 0)
    return model.eval(), tok


def test_the_stream_starts_where_torchs_generator_stands_and_leaves_it_alone():
    torch.manual_seed(5)
    expected = torch.rand(4, 1)  # what the global generator gives from seed 5
    torch.manual_seed(5)
    draws = StreamDraws()
    got = draws.uniform(torch.arange(4), "cpu", torch.float32)
    assert torch.equal(got, expected)
    after = torch.get_rng_state()
    draws.uniform(torch.arange(3), "cpu", torch.float32)
    assert torch.equal(torch.get_rng_state(), after)  # the stream moved, the global generator did not


def test_the_stream_stands_in_for_torchs_generator_inside_as_global_only():
    torch.manual_seed(1)
    draws = StreamDraws()
    draws.generator("cpu")  # starts here
    outside = torch.get_rng_state()
    with draws.as_global("cpu"):
        a = torch.rand(2)
    assert torch.equal(torch.get_rng_state(), outside)  # put back after
    torch.manual_seed(1)
    assert torch.equal(a, torch.rand(2))  # inside, the stream's numbers
    with draws.as_global("cpu"):
        b = torch.rand(2)
    assert torch.equal(b, torch.rand(2))  # and it continued from where the first call left it


def test_a_checkpointed_stream_continues_exactly():
    torch.manual_seed(2)
    draws = StreamDraws()
    draws.uniform(torch.arange(5), "cpu", torch.float32)
    state = draws.state_dict()
    later = draws.uniform(torch.arange(3), "cpu", torch.float32)
    again = StreamDraws()
    again.load_state_dict(state)
    torch.manual_seed(99)  # whatever the global generator holds now
    assert torch.equal(again.uniform(torch.arange(3), "cpu", torch.float32), later)


def test_request_seeds_are_a_function_of_the_key_only():
    assert request_seed(0, "train", 3, 0, 7) == request_seed(0, "train", 3, 0, 7)
    seeds = {request_seed(0, "train", 3, 0, r) for r in range(100)}
    assert len(seeds) == 100 and all(0 <= s < 2**63 for s in seeds)
    assert request_seed(0, "train", 3, 0, 7) != request_seed(1, "train", 3, 0, 7) != request_seed(0, "eval", 3, 0, 7)


def test_a_requests_draws_do_not_depend_on_the_others_in_its_call():
    u = RequestDraws(0, "train", 2).uniform(torch.arange(4), "cpu", torch.float32)
    # row 2 alone, then rows 3 and 2: each row's first draw is its own generator's first
    alone = RequestDraws(0, "train", 2).uniform(torch.tensor([2]), "cpu", torch.float32)
    swapped = RequestDraws(0, "train", 2).uniform(torch.tensor([3, 2]), "cpu", torch.float32)
    assert alone[0, 0] == u[2, 0] and swapped[0, 0] == u[3, 0] and swapped[1, 0] == u[2, 0]
    # each draw by hand: the first uniform of a generator seeded with the row's key
    for r in range(4):
        g = torch.Generator().manual_seed(request_seed(0, "train", 2, 0, r))
        assert u[r, 0] == torch.rand(1, generator=g)[0]
    # a call whose rows are the step's rows 8..11 draws as those rows
    shifted = RequestDraws(0, "train", 2, rows=[8, 9, 10, 11]).uniform(torch.arange(4), "cpu", torch.float32)
    assert torch.equal(shifted, RequestDraws(0, "train", 2).uniform(torch.arange(12), "cpu", torch.float32)[8:])
    with pytest.raises(ValueError, match="own generator"):
        RequestDraws(0, "train", 2).as_global("cpu")


def test_inverse_cdf_sampling_reads_one_draw_per_row_from_the_draws():
    logits = torch.tensor([[0.0, 0.0], [10.0, -10.0]])

    class Fixed:
        per_request = True

        def uniform(self, rows, device, dtype):
            return torch.tensor([[0.75], [0.2]], dtype=dtype)[rows]

    # row 0: cdf [0.5, 1.0], u = 0.75 -> token 1; row 1: cdf [~1, 1], u = 0.2 -> token 0
    tok, lp = sample(logits, 1.0, False, Fixed(), torch.tensor([0, 1]))
    assert tok.tolist() == [1, 0]
    assert lp[0] == pytest.approx(torch.log(torch.tensor(0.5)).item())


def test_no_engine_call_draws_from_torchs_generator(policy):
    model, tok = policy
    prompts = ["1+2=", "1+2=", "3+4=", "3+4="]
    for gen in (fast_generate, hf_generate):
        for draws in (StreamDraws(), RequestDraws(0, "train", 0)):
            torch.manual_seed(0)
            before = torch.get_rng_state()
            gen(model, tok, prompts, max_new_tokens=5, temperature=1.0, draws=draws) if gen is hf_generate else \
                gen(model, tok, prompts, max_new_tokens=5, temperature=1.0, generator=draws)
            assert torch.equal(torch.get_rng_state(), before), (gen.__name__, type(draws).__name__)


def test_per_request_draws_give_the_fast_and_hf_engines_the_same_tokens(policy):
    model, tok = policy
    prompts = ["12+7=", "12+7=", "3+45=", "3+45="]
    fast = fast_generate(model, tok, prompts, max_new_tokens=6, temperature=1.0,
                         generator=RequestDraws(3, "train", 1))
    hf = hf_generate(model, tok, prompts, max_new_tokens=6, temperature=1.0, draws=RequestDraws(3, "train", 1))
    assert fast.texts == hf.texts
    assert torch.allclose(fast.rollout_logp, hf.rollout_logp, atol=1e-5)
    # and a completion's tokens are its key's: the same prompt's rows in the other order swap their texts
    swapped = fast_generate(model, tok, prompts, max_new_tokens=6, temperature=1.0,
                            generator=RequestDraws(3, "train", 1, rows=[1, 0, 3, 2]))
    assert swapped.texts == [fast.texts[1], fast.texts[0], fast.texts[3], fast.texts[2]]


def test_the_global_draws_are_torchs_own():
    torch.manual_seed(4)
    a = GlobalDraws().uniform(torch.arange(3), "cpu", torch.float32)
    torch.manual_seed(4)
    assert torch.equal(a, torch.rand(3, 1))
    torch.manual_seed(4)
    base = int(torch.randint(0, 2**31 - 1, (1,)))
    torch.manual_seed(4)
    assert GlobalDraws().seeds(3) == [base, base + 1, base + 2]


def test_seeding_is_checked_by_the_config():
    assert RolloutConfig().seeding == "stream"
    assert RolloutConfig(seeding="request").seeding == "request"
    with pytest.raises(ConfigError, match="rollout.seeding"):
        RolloutConfig(seeding="dice")
