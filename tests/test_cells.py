"""A cell claimed in the tracking store before it runs (``tracking/cells.py``), on a real SQLite MLflow store:
one claim at a time per cell, a dead driver's claim ignored and removed, a cell done or at work left alone,
the heartbeat, claims never counted by a table, and no claim run left RUNNING once released, however it ends."""

from __future__ import annotations

import subprocess
import sys
import time

import mlflow
import pytest
from mlflow.entities import ViewType

from gspo_bench.tracking import cells
from gspo_bench.tracking.lifecycle import owner_tags


@pytest.fixture
def store(tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = mlflow.MlflowClient(uri)
    return uri, client, client.create_experiment("cells", artifact_location=str(tmp_path / "artifacts"))


def _active_claims(client, exp_id) -> list:
    return client.search_runs([exp_id], "tags.kind = 'claim'")


def _every_claim(client, exp_id) -> dict:
    """{run id: (status, lifecycle stage)} of every claim run, deleted ones too."""
    return {r.info.run_id: (r.info.status, r.info.lifecycle_stage)
            for r in client.search_runs([exp_id], "tags.kind = 'claim'", run_view_type=ViewType.ALL)}


def test_a_held_cell_cannot_be_claimed_again_until_it_is_released(store):
    _, client, exp = store
    first, why = cells.claim_cell(client, exp, "smoke", "grpo", 0)
    assert first is not None and why is None
    second, why = cells.claim_cell(client, exp, "smoke", "grpo", 0, attempts=2, wait_s=(0.0, 0.01))
    assert second is None and why.startswith("claimed by another driver") and first.run_id in why
    other, _ = cells.claim_cell(client, exp, "smoke", "grpo", 1)  # another cell is free
    assert other is not None
    assert sorted(r.data.tags["cell"] for r in _active_claims(client, exp)) == ["smoke/grpo/0", "smoke/grpo/1"]
    first.release()
    other.release()
    assert _active_claims(client, exp) == []  # the yielding driver left no claim behind either
    again, _ = cells.claim_cell(client, exp, "smoke", "grpo", 0)
    assert again is not None
    again.release()


def test_a_dead_drivers_claim_is_ignored_and_removed(store):
    _, client, exp = store
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead = {**owner_tags(), "gspo_bench.pid": gone.stdout.strip(), "gspo_bench.pid_start": "1"}
    stale = client.create_run(exp, tags={"kind": "claim", "cell": "smoke/gspo/0", **dead}).info.run_id
    claim, why = cells.claim_cell(client, exp, "smoke", "gspo", 0)
    assert claim is not None, why
    run = client.get_run(stale)
    assert (run.info.status, run.info.lifecycle_stage) == ("KILLED", "deleted")
    assert run.data.tags["killed_reason"].startswith("orphaned: its process")
    claim.release()


def test_a_cell_finished_or_at_work_elsewhere_is_left_alone(store):
    _, client, exp = store
    cell_tags = {"algo": "dapo", "seed": "2", "preset": "smoke"}
    working = client.create_run(exp, tags={**cell_tags, **owner_tags()}).info.run_id  # RUNNING, this live process
    claim, why = cells.claim_cell(client, exp, "smoke", "dapo", 2)
    assert claim is None and why == f"being run by pid {owner_tags()['gspo_bench.pid']} on " \
                                    f"{owner_tags()['gspo_bench.host']} (run {working})"
    client.set_terminated(working, "FINISHED")
    claim, why = cells.claim_cell(client, exp, "smoke", "dapo", 2)
    assert claim is None and why == f"FINISHED meanwhile (run {working})"
    client.set_terminated(working, "FAILED")  # a failed cell runs again
    claim, why = cells.claim_cell(client, exp, "smoke", "dapo", 2)
    assert claim is not None
    claim.release()
    assert _active_claims(client, exp) == []


def test_a_held_claim_beats_and_its_context_releases_it(store):
    _, client, exp = store
    claim, _ = cells.claim_cell(client, exp, "smoke", "ppo", 0)
    first = float(client.get_run(claim.run_id).data.tags["gspo_bench.heartbeat"])
    time.sleep(1.1)  # the heartbeat tag has whole seconds
    claim.keep_alive(every_s=0.05)
    deadline = time.time() + 10
    while float(client.get_run(claim.run_id).data.tags["gspo_bench.heartbeat"]) <= first and time.time() < deadline:
        time.sleep(0.05)
    assert float(client.get_run(claim.run_id).data.tags["gspo_bench.heartbeat"]) > first
    claim.release()
    claim2, _ = cells.claim_cell(client, exp, "smoke", "ppo", 0)
    with claim2:
        assert [r.info.run_id for r in _active_claims(client, exp)] == [claim2.run_id]
    assert _active_claims(client, exp) == []


def test_a_claim_is_no_run_of_any_table_and_no_orphan_to_mark(store):
    from gspo_bench.reporting.leaderboard import load_runs
    from gspo_bench.tracking.lifecycle import mark_orphans

    uri, client, exp = store
    claim, _ = cells.claim_cell(client, exp, "smoke", "grpo", 0)
    assert load_runs(uri, "cells") == []
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    client.set_tag(claim.run_id, "gspo_bench.pid", gone.stdout.strip())
    assert mark_orphans(client, exp, log=lambda *_: None) == []  # the cells module tidies dead claims
    claim.release()


def test_a_claim_on_a_node_the_scheduler_reports_dead_is_released_and_its_run_marked_killed(store):
    _, client, exp = store
    cell_tags = {"algo": "gspo", "seed": "1", "preset": "smoke"}
    # a worker on another host, its heartbeat fresh: alive by every rule but the scheduler's word
    far = {**owner_tags(), "gspo_bench.host": "node-b.example", "gspo_bench.pid": "4242"}
    gone = client.create_run(exp, tags={"kind": "claim", "cell": "smoke/gspo/1", cells.NODE_TAG: "n-dead",
                                        **cell_tags, **far}).info.run_id
    held = client.create_run(exp, tags={**cell_tags, **far}).info.run_id
    other_far = {**far, "gspo_bench.pid": "4343"}  # another process of that host, on a live node
    live = client.create_run(exp, tags={"kind": "claim", "cell": "smoke/gspo/1", cells.NODE_TAG: "n-live",
                                        **cell_tags, **other_far}).info.run_id
    working = client.create_run(exp, tags={**cell_tags, **other_far}).info.run_id
    claim, why = cells.claim_cell(client, exp, "smoke", "gspo", 1, attempts=1)
    assert claim is None and "on node-b.example" in why  # at work there, until the scheduler says otherwise

    marked = cells.release_dead_claims(client, exp, "smoke", "gspo", 1, {"n-dead"}, "orphaned: its node left")
    assert marked == [held]
    run = client.get_run(held)
    assert run.info.status == "KILLED" and run.data.tags["killed_reason"] == "orphaned: its node left"
    assert (client.get_run(gone).info.status, client.get_run(gone).info.lifecycle_stage) == ("KILLED", "deleted")
    assert client.get_run(live).info.lifecycle_stage == "active"  # the live node's claim and run stay
    assert client.get_run(working).info.status == "RUNNING"


def test_a_claim_carries_the_owner_tags_it_is_given(store):
    _, client, exp = store
    claim, _ = cells.claim_cell(client, exp, "smoke", "cispo", 0, tags={cells.NODE_TAG: "n-1"})
    [run] = _active_claims(client, exp)
    assert run.info.run_id == claim.run_id and run.data.tags[cells.NODE_TAG] == "n-1"
    claim.release()


def test_a_released_claim_ends_finished_or_killed_never_running(store):
    _, client, exp = store
    done, _ = cells.claim_cell(client, exp, "smoke", "grpo", 0)
    with done:  # its cell ended, whatever its status
        pass
    yielding, why = cells.claim_cell(client, exp, "smoke", "grpo", 1, attempts=1)
    with yielding:
        other, why = cells.claim_cell(client, exp, "smoke", "grpo", 1, attempts=1)  # backs off: its claim ends
        assert other is None and why.startswith("claimed by another driver")
    stopped, _ = cells.claim_cell(client, exp, "smoke", "grpo", 2)
    with pytest.raises(KeyboardInterrupt), stopped:  # a signal's stop out of the cell
        raise KeyboardInterrupt
    every = _every_claim(client, exp)
    assert len(every) == 4 and not [r for r, (status, _) in every.items() if status == "RUNNING"], every
    assert {stage for _, stage in every.values()} == {"deleted"}
    assert every[done.run_id][0] == every[yielding.run_id][0] == "FINISHED"
    assert every[stopped.run_id][0] == "KILLED"
    assert client.get_run(stopped.run_id).data.tags["killed_reason"] == "its holder stopped: KeyboardInterrupt"
    [backed_off] = set(every) - {done.run_id, yielding.run_id, stopped.run_id}
    assert every[backed_off][0] == "FINISHED"


def test_the_claims_a_driver_s_dead_workers_left_end_killed_with_their_runs(store):
    _, client, exp = store
    worker = {**owner_tags(), "gspo_bench.host": "node-b.example", "gspo_bench.pid": "4242"}
    held = {}
    for seed, driver in ((0, "d1"), (1, "d1"), (2, "d2")):
        tags = {"algo": "grpo", "seed": str(seed), "preset": "smoke"}
        claim = client.create_run(exp, tags={"kind": "claim", "cell": f"smoke/grpo/{seed}", cells.DRIVER_TAG: driver,
                                             **tags, **worker}).info.run_id
        held[seed] = (claim, client.create_run(exp, tags={**tags, **worker}).info.run_id)
    marked = cells.release_claims(client, exp, cells.DRIVER_TAG, {"d1"}, "orphaned: its Ray node died")
    assert sorted(marked) == [("smoke/grpo/0", held[0][1]), ("smoke/grpo/1", held[1][1])]
    for seed in (0, 1):
        claim, run = (client.get_run(r) for r in held[seed])
        assert (claim.info.status, claim.info.lifecycle_stage) == ("KILLED", "deleted")
        assert run.info.status == "KILLED" and run.data.tags["killed_reason"] == "orphaned: its Ray node died"
    assert [client.get_run(r).info.status for r in held[2]] == ["RUNNING", "RUNNING"]  # another driver's
    assert cells.release_claims(client, exp, cells.DRIVER_TAG, {"d2"}, "gone", cell="smoke/grpo/0") == []
