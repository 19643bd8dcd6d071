"""``cli/pages.py``: the command line asks torch for huge pages before torch allocates, keeping a value the
user set, and a large tensor of such a process is then backed by them where the kernel allows."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from gspo_bench.cli.measure import MODES
from gspo_bench.cli.pages import HUGE_PAGES, OURS_ONLY, prefer_huge_pages, wants_huge_pages

# a process started as the command line is, that allocates 64 MiB and says how much of its memory is huge pages
PROBE = ("import sys; sys.argv = ['gspo_bench', '--help']; import gspo_bench.__main__; import torch; "
         "x = torch.ones(16 * 2**20); print(open('/proc/self/smaps_rollup').read())")


def test_it_is_on_unless_the_user_said_otherwise():
    env = {}
    assert prefer_huge_pages(env) and env == {HUGE_PAGES: "1"}
    env = {HUGE_PAGES: "0"}
    assert not prefer_huge_pages(env) and env == {HUGE_PAGES: "0"}


def test_a_bench_against_another_implementation_asks_for_none_since_its_users_do_not():
    assert wants_huge_pages(["run", "--algos", "all"]) and wants_huge_pages(["tune", "--algo", "bench"])
    for ours in (["--memory", "none"], ["--memory=none"], ["--whole"], ["--presets", "smoke"], ["--async", "0"],
                 ["--suite-ray"]):
        assert wants_huge_pages(["bench", *ours]), ours
    for theirs in (["--vs", "trl"], ["--vs=trl"], ["--engines", "fast,hf"], [], ["--model", "tiny-moe"]):
        assert not wants_huge_pages(["bench", *theirs]), theirs
    # every measurement bench can make is one or the other
    assert set(OURS_ONLY) | {"--vs", "--engines"} == {flag for flag, _ in MODES}
    env = {}
    assert not prefer_huge_pages(env, ["bench", "--vs", "trl"]) and env == {}
    env = {HUGE_PAGES: "1"}  # the user's own choice is kept
    assert prefer_huge_pages(env, ["bench", "--vs", "trl"]) and env == {HUGE_PAGES: "1"}


def _huge_kib(extra: dict) -> int:
    env = {k: v for k, v in os.environ.items() if k != HUGE_PAGES} | extra
    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, env=env, check=True).stdout
    return int(re.search(r"AnonHugePages:\s+(\d+) kB", out).group(1))


def test_a_large_tensor_of_the_command_line_s_process_sits_on_huge_pages():
    mode = re.search(r"\[(\w+)\]", Path("/sys/kernel/mm/transparent_hugepage/enabled").read_text()).group(1)
    on, off = _huge_kib({}), _huge_kib({HUGE_PAGES: "0"})
    if mode == "never":  # the kernel gives none: asking changes nothing
        assert on == off == 0
    else:
        assert on >= 32 * 1024, on  # at least half of the 64 MiB tensor
        if mode == "madvise":  # only what is asked for
            assert off < 32 * 1024, off
