"""The settings digest: which settings make two runs the same, for ``--resume`` and the reports."""

from __future__ import annotations

import subprocess
import sys

from gspo_bench.tracking.digest import config_digest


def test_config_digest_ignores_only_where_and_how_often():
    base = {"train": {"lr": 1e-3, "progress": True, "checkpoint_every": 10}, "tracking": {"experiment": "a"},
            "resolved": {"warmstart": {"path": "/a", "pass1": 0.4}}}
    same = {"train": {"lr": 1e-3, "progress": False, "checkpoint_every": 0}, "tracking": {"experiment": "b"},
            "resolved": {"warmstart": {"path": "/b", "pass1": 0.4}}}
    other = {**same, "train": {**same["train"], "lr": 2e-3}}
    assert config_digest(base) == config_digest(same) != config_digest(other)


def test_config_digest_ignores_how_a_step_is_laid_out_in_memory():
    """Micro-batches, the LM head's chunks, checkpointed layers and the MoE kernel compute the same step: a run
    that ran out of memory resumes with them as the same run, and such runs are one config group."""
    base = {"train": {"lr": 1e-3, "micro_batch_tokens": None, "logit_chunk_tokens": 4096,
                      "activation_checkpointing": False}, "rollout": {"moe_kernel": "auto", "temperature": 1.0},
            "resolved": {"rollout": {"moe_kernel": "auto", "temperature": 1.0}}}
    lean = {"train": {"lr": 1e-3, "micro_batch_tokens": 512, "logit_chunk_tokens": 0,
                      "activation_checkpointing": True}, "rollout": {"moe_kernel": "batched", "temperature": 1.0},
            "resolved": {"rollout": {"moe_kernel": "batched", "temperature": 1.0}}}
    hotter = {**lean, "rollout": {"moe_kernel": "batched", "temperature": 1.2}}
    assert config_digest(base) == config_digest(lean) != config_digest(hotter)


def test_the_reports_read_which_settings_count_without_loading_lightning():
    """The report, leaderboard and claims commands group runs by ``NOT_HASHED``: reading it costs no Lightning
    (some seconds of imports at every start)."""
    code = ("import sys; from gspo_bench.reporting import frame; from gspo_bench.tracking.digest import NOT_HASHED; "
            "frame._params_and_tags(frame.RunData('r', 'FINISHED', {}, {'train.lr': '1'}, {}, {}, '', 'e', None)); "
            "print('lightning' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"
