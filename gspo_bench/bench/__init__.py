"""Measuring speed: ``bench`` (``throughput.py``: rollout, training and the full RL step against
transformers and the hardware), ``bench --engines`` (``engines.py``), ``bench --vs trl`` (``trl.py``), ``bench
--whole`` (``whole.py``: ``run --algos all`` timed by phase), ``bench --suite-ray`` (``suite_ray.py``: the
smoke suite serially and on Ray), ``scale_out.py`` (per-rank work and collective costs on N processes), and
``tables.py`` (their tables and the scaling figure).

May import: train and everything below it.
"""
