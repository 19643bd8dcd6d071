"""``--by TAG[,TAG...]``: leaderboard and report groups split further by the values of any run tags.

A group is (task, model, preset, config) (``frame.RunData.group``). With
``by`` (e.g. ``("routing_replay", "rollout_dtype")``) it is that plus the
run's value of each of those tags, ``MISSING`` (``-``) for a run without the
tag (so such runs form a split of their own, never merged into another).

- ``leaderboard.summarise(runs, by)`` gives each row ``row["by"]`` =
  {tag: value} in ``by`` order, and the renderers add one column per tag,
  named by the tag, right after ``config``. Without ``by`` rows have no
  ``"by"`` key and every output is as before.
- ``paired_table.paired_groups(runs, baseline, by=by)`` pairs seeds within
  each split: under ``--by routing_replay`` gspo with r3 is compared with
  grpo with r3, never with grpo with none.
- ``--baseline TAG=VALUE`` (TAG one of ``by``) compares splits instead:
  ``split_pairs.split_pair_groups`` pairs each algorithm's split with its
  split having TAG=VALUE and the other ``by`` values equal, seed by seed
  (gspo under r3/tis vs gspo under none/tis).
- ``report.write_report(..., by=by)`` writes a section per split; its figure
  names carry ``by_slug`` so splits never overwrite each other's files.

``check_by`` is the one-line ``ConfigError`` for a tag no run has (or one
that is already a leaderboard column).
"""

from __future__ import annotations

from gspo_bench.config import ConfigError

MISSING = "-"  # the value of a tag a run does not have
SYSTEM = "mlflow."  # MLflow's own tags: accepted by --by, left out of the error's list


def split_values(tags: dict[str, str], by: tuple[str, ...]) -> tuple[str, ...]:
    """The run's value of each ``by`` tag, ``MISSING`` where it has none (or an empty one)."""
    return tuple(tags.get(t) or MISSING for t in by)


def by_names(items: list) -> tuple[str, ...]:
    """The ``by`` tags of leaderboard or paired rows (their ``"by"`` dict), in order; () without ``--by``."""
    return tuple(items[0].get("by", {})) if items else ()


def flat(row: dict) -> dict:
    """The row with its ``by`` values as top-level keys (for CSV writers)."""
    return {**row, **row.get("by", {})} if "by" in row else row


def with_by(columns: tuple[str, ...], names: tuple[str, ...], after: str = "config") -> tuple[str, ...]:
    """``columns`` with ``names`` inserted right after ``after``."""
    i = columns.index(after) + 1
    return (*columns[:i], *names, *columns[i:])


def by_title(names: tuple[str, ...], values: tuple[str, ...]) -> str:
    """`` / routing_replay=r3 / rollout_dtype=bfloat16`` (empty without ``by``): appended to group titles."""
    return "".join(f" / {n}={v}" for n, v in zip(names, values))


def by_slug(names: tuple[str, ...], values: tuple[str, ...]) -> list[str]:
    """File-name parts of a split: ``routing_replay-r3``, or ``no-routing_replay`` for a run without the tag
    (``leaderboard.slug`` then makes them file-name safe)."""
    return [f"no-{n}" if v == MISSING else f"{n}-{v}" for n, v in zip(names, values)]


# the leaderboard's and paired table's CSV columns, and the tag behind "config": no --by tag may take these names
# (spelled out here, not imported, so grouping stays below leaderboard in the import graph; a test keeps them equal)
RESERVED_COLUMNS = frozenset((
    "algo", "auc_pass1", "auc_pass1_std", "baseline", "best_pass1", "best_pass1_std", "by", "ci_high", "ci_low",
    "clip_frac", "collapses", "common", "completions_per_s", "config", "final_pass1", "final_pass1_std",
    "group_mde_final_pass1", "group_mde_pairs", "mde", "mde_alpha", "mean_diff", "metric", "model", "n", "p", "p_holm",
    "preset",
    "reached_10", "sd_diff", "seeds", "significant", "status", "steps_to_10", "task", "tuning", "wall_s", "warm_pass1"))


def check_by(runs: list, by: tuple[str, ...]) -> None:
    """ConfigError (one line) when a ``by`` tag is a leaderboard column already, or no run in ``runs`` has it;
    the message lists the tags the runs do have."""
    taken = [t for t in by if t in RESERVED_COLUMNS]
    if taken:
        raise ConfigError(f"--by {', '.join(map(repr, taken))}: already a leaderboard column (task, model, "
                          "preset, config = tag tuning, algo, ...); --by takes other run tags, e.g. "
                          "--by routing_replay,rollout_dtype")
    have = sorted({t for r in runs for t, v in r.tags.items() if v})
    missing = [t for t in by if t not in have]
    if missing:
        shown = [t for t in have if not t.startswith(SYSTEM)]
        system = len(have) - len(shown)
        which = "this tag" if len(missing) == 1 else "these tags"
        raise ConfigError(f"--by {', '.join(map(repr, missing))}: no run in the selection has {which} (the runs' "
                          f"tags: {', '.join(shown) or 'none'}"
                          + (f"; plus {system} {SYSTEM}* tag{'s' if system != 1 else ''}" if system else "") + ")")
