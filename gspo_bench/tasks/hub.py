"""Hugging Face data sets as tasks (``kind: hf``), read from this machine only.

``params.path`` names the data set in one of four forms, tried in this order:

1. a ``save_to_disk`` folder (it holds ``dataset_dict.json`` or ``state.json``): ``datasets.load_from_disk``;
2. any other local folder, e.g. a copy of the hub repository (``main/train-00000-of-00001.parquet``,
   ``test.jsonl``): ``datasets.load_dataset(folder)``, with ``data_dir=name`` when the folder has a
   sub-folder named after the config (the hub's layout), else ``name`` as the config its README declares
   (a folder with neither is a one-line ``ValueError`` that says so: ``check_config``);
3. a hub id whose repository is in the hub cache (``hf download --repo-type dataset ID`` puts it there,
   ``$HF_HUB_CACHE``, else ``$HF_HOME/hub``): that snapshot folder, read as in 2;
4. a hub id that ``load_dataset`` prepared before (``$HF_DATASETS_CACHE``, else ``$HF_HOME/datasets``):
   ``load_dataset(ID, name)`` offline.

Nothing is downloaded: every read runs with ``HF_HUB_OFFLINE`` on (``offline()``), and a data set in none of
those places is a one-line ``ValueError`` that says how to get it and how to point the task at a copy,
raised by ``locate`` before any work (``task.check_task_data``, which reads the rows too).

A row becomes ``prompt`` (``template``, ``str.format`` over the row's columns; default the
``prompt_field``), ``answer`` (the ``answer_field``, cut by ``extract``: ``"####"`` keeps the number after
GSM8K's last ``####``, ``boxed`` the content of the last ``\\boxed{...}``) and ``target`` (the
``target_field``, default the answer field, uncut: the worked solution the warm start trains on). The eval
split is ``eval_split`` when named, else a seeded hold-out of ``n_eval`` rows (at most half), as the file
kind does.
"""

from __future__ import annotations

import os
import string
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import datasets

from gspo_bench.models import HUB_ID, hub_cache_dir
from gspo_bench.tasks.generators import (check_sizes, datasets_muted, hold_out, load_error, non_utf8_at,
                                         register_generator)


def datasets_cache_dir() -> Path:
    """Where ``load_dataset`` keeps prepared data sets, read at call time: $HF_DATASETS_CACHE, else
    $HF_HOME/datasets, else the library's default."""
    if os.environ.get("HF_DATASETS_CACHE"):
        return Path(os.environ["HF_DATASETS_CACHE"]).expanduser()
    if os.environ.get("HF_HOME"):
        return Path(os.environ["HF_HOME"]).expanduser() / "datasets"
    return Path(datasets.config.HF_DATASETS_CACHE).expanduser()


@contextmanager
def offline():
    """``HF_HUB_OFFLINE=1`` for the calls inside. datasets and huggingface_hub read the variable once, when
    imported, so setting it now would change nothing: their module flags are set for the duration instead."""
    import huggingface_hub.constants as hub_constants

    saved = (datasets.config.HF_HUB_OFFLINE, datasets.config.HF_DATASETS_OFFLINE, hub_constants.HF_HUB_OFFLINE)
    datasets.config.HF_HUB_OFFLINE = datasets.config.HF_DATASETS_OFFLINE = hub_constants.HF_HUB_OFFLINE = True
    try:
        yield
    finally:
        datasets.config.HF_HUB_OFFLINE, datasets.config.HF_DATASETS_OFFLINE, hub_constants.HF_HUB_OFFLINE = saved


@dataclass(frozen=True)
class Source:
    """Where a data set was found: ``disk`` (a save_to_disk folder), ``folder`` (data files, a local copy or a
    hub-cache snapshot) or ``prepared`` (the datasets cache, by hub id)."""

    kind: str
    where: str


def is_saved_to_disk(folder: Path) -> bool:
    return (folder / "dataset_dict.json").is_file() or (folder / "state.json").is_file()


def _snapshot(repo_id: str) -> Path | None:
    """The hub-cache snapshot of a data set repository, or None; a look in the cache, never the network."""
    from huggingface_hub import snapshot_download

    try:
        return Path(snapshot_download(repo_id, repo_type="dataset", cache_dir=str(hub_cache_dir()),
                                      local_files_only=True))
    except Exception:  # LocalEntryNotFoundError (not cached), or a name the hub would not take
        return None


def _prepared(repo_id: str, name: str | None) -> Path | None:
    """The datasets-cache folder ``load_dataset(repo_id, name)`` prepared before, or None."""
    from datasets.naming import camelcase_to_snakecase

    parts = repo_id.split("/")
    parts[-1] = camelcase_to_snakecase(parts[-1])  # the cache's own folder name for a hub id
    root = datasets_cache_dir() / "___".join(parts)
    found = sorted(p for p in root.glob(f"{name or '*'}/*/*") if p.is_dir())
    return found[0] if found else None


def locate(path: str, name: str | None = None) -> Source:
    """Where ``path`` (a folder or a hub id) is on this machine, checked without loading any data; a
    ``ValueError`` naming every place looked in and how to get the data when it is nowhere."""
    local = Path(path).expanduser()
    if local.is_dir():
        return Source("disk" if is_saved_to_disk(local) else "folder", str(local))
    if local.exists():
        raise ValueError(f"{path}: a file, not a data set folder (a single data file is kind: file)")
    looks_local = path.startswith((".", "/", "~")) or not HUB_ID.match(path) or path.count("/") > 1
    if not looks_local:
        if (snap := _snapshot(path)) is not None:
            return Source("folder", str(snap))
        if _prepared(path, name) is not None:
            return Source("prepared", path)
    config = f" (config {name})" if name else ""
    get = (f"get it with `hf download --repo-type dataset {path}` (or `huggingface-cli download --repo-type "
           f"dataset {path}`), or " if not looks_local else "")
    places = (f"not in the Hugging Face hub cache ({hub_cache_dir()}) nor the datasets cache "
              f"({datasets_cache_dir()}), and not a local folder" if not looks_local else "no such folder")
    raise ValueError(f"data set {path!r}{config} is not on this machine: {places}; nothing is downloaded: "
                     f"{get}point the task at a local copy with --set task.path=DIR (a folder of its data files or "
                     "a save_to_disk folder) or path: in a task YAML")


def load_split(source: Source, name: str | None, split: str) -> datasets.Dataset:
    """One split of a located data set (see the module docstring for each kind of source); what ``datasets``
    cannot read is a one-line ValueError naming the folder, or the file that is not UTF-8 (``read_error``)."""
    cache = str(datasets_cache_dir())
    with offline(), datasets_muted():  # our one line says what datasets logs before it raises
        if source.kind == "disk":
            saved = datasets.load_from_disk(source.where)
            if isinstance(saved, datasets.DatasetDict):
                if split not in saved:
                    raise ValueError(f"{source.where}: no split {split!r} (splits: {', '.join(saved)})")
                return saved[split]
            return saved  # a single saved Dataset is whichever split the spec names
        if source.kind == "folder":
            by_dir = bool(name) and (Path(source.where) / name).is_dir()
            if name and not by_dir:
                check_config(source.where, name, split)
            try:
                return datasets.load_dataset(source.where, None if by_dir else name,
                                             data_dir=name if by_dir else None, split=split, cache_dir=cache)
            except Exception as e:
                raise read_error(source, e) from None
        try:
            return datasets.load_dataset(source.where, name, split=split, cache_dir=cache)
        except Exception as e:
            raise read_error(source, e) from None


def check_config(folder: str, name: str, split: str) -> None:
    """A folder read as config ``name`` without a sub-folder of that name must declare the config in its
    README.md (``configs:``, as a hub repository's card does); else a ValueError that says the layouts read."""
    configs = datasets.get_dataset_config_names(folder)
    if name not in configs:
        raise ValueError(f"{folder}: no config {name!r}: expected {folder}/{name}/{split}-*.parquet as on the hub "
                         f"(the config's data files in a sub-folder named after it) or a README.md whose configs: "
                         f"list config_name: {name}; the folder's files make config(s) {', '.join(configs)}, read "
                         "as they are with --set 'task.params={name: null}'")


TEXT_SUFFIXES = (".json", ".jsonl", ".csv", ".tsv", ".txt")  # data files that must be UTF-8


def read_error(source: Source, e: Exception) -> ValueError:
    """What ``datasets`` could not read in a data set, as one line: the first text data file of a folder that
    is not UTF-8 with the offset of its bad byte (pyarrow keeps such bytes as they are, so the error comes
    from wherever they are read back), else the folder (or hub id) and the parser's first line."""
    if source.kind == "folder":
        root = Path(source.where)
        for f in sorted(root.rglob("*")):
            hidden = any(part.startswith(".") for part in f.relative_to(root).parts)  # .cache/, .git/
            if f.suffix.lower() in TEXT_SUFFIXES and not hidden and f.is_file() and non_utf8_at(f) is not None:
                return load_error(str(f), e, f)
    return load_error(source.where, e)


# ----------------------------------------------------------------------------- answer extraction


def after_hashes(text: str) -> str:
    """GSM8K's final answer: the first line after the last ``####``, commas dropped (``#### 1,000`` -> 1000)."""
    tail = text.rsplit("####", 1)[-1].strip()
    return (tail.splitlines() or [""])[0].replace(",", "").strip()


def last_boxed(text: str) -> str:
    """The content of the last ``\\boxed{...}``, its braces matched (``\\boxed{\\frac{1}{2}}`` -> ``\\frac{1}{2}``);
    the text stripped when it has none."""
    start = text.rfind("\\boxed{")
    if start < 0:
        return text.strip()
    i = start + len("\\boxed{")
    depth = 1
    for j in range(i, len(text)):
        depth += {"{": 1, "}": -1}.get(text[j], 0)
        if depth == 0:
            return text[i:j].strip()
    return text[i:].strip()  # unclosed: everything after the opening brace


EXTRACTORS = {"####": after_hashes, "boxed": last_boxed}


def template_fields(template: str) -> list[str]:
    """The column names a prompt template reads (``"Question: {question}"`` -> ``["question"]``)."""
    return [f for _, f, _, _ in string.Formatter().parse(template) if f]


@register_generator("hf")
def load_hf(
    seed: int, path: str, name: str | None = None, split: str = "train", eval_split: str | None = None,
    n_eval: int = 256, prompt_field: str = "prompt", answer_field: str = "answer", target_field: str | None = None,
    template: str | None = None, extract: str | None = None,
) -> tuple[datasets.Dataset, datasets.Dataset]:
    """A Hugging Face data set from this machine (the module docstring has the places and the row rules)."""
    if extract is not None and extract not in EXTRACTORS:
        raise ValueError(f"extract={extract!r} is not allowed (allowed: {', '.join(EXTRACTORS)}, or null)")
    check_sizes("hf", 0, n_eval)
    template = template or "{" + prompt_field + "}"
    cut = EXTRACTORS[extract] if extract else str.strip
    tgt = target_field or answer_field
    source = locate(path, name)

    def rows(which: str) -> datasets.Dataset:
        ds = load_split(source, name, which)
        missing = sorted({*template_fields(template), answer_field, tgt} - set(ds.column_names))
        if missing:
            raise ValueError(f"{path} split {which!r}: missing field(s) {missing}; columns are {ds.column_names}")
        try:
            return ds.map(lambda r: {"prompt": template.format(**r), "answer": cut(str(r[answer_field])),
                                     "target": str(r[tgt])}, remove_columns=ds.column_names)
        except UnicodeDecodeError as e:  # bytes that are not UTF-8, kept by pyarrow, read back here
            raise read_error(source, e) from None

    train = rows(split)
    if eval_split:
        return train, rows(eval_split)
    return hold_out(train, path, n_eval, seed)
