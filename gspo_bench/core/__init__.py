"""The core math: pure functions of tensors, no config objects, no logging.

``losses.py`` (every registered policy loss, aggregation, KL estimators),
``ratios.py`` (masked reductions, ratio and clip statistics, mismatch
corrections), ``advantages.py`` (the advantage estimators' registry, group
z-scores, GAE, shaping),
``entropy_control.py`` (the entropy bonus's coefficient, fixed or adaptive),
``metrics.py`` (a minibatch's statistics merged from its parts', and their per-step reduction), ``lm_head.py`` (log-probs and
entropy through the LM head in token chunks), ``collectives.py`` (sums, gathers
and shares across the processes of a multi-process run), ``rng.py`` (every
random generator's state), ``names.py`` (the name lists the config checks,
torch-free), ``loss_params.py`` (each loss parameter's declaration: default,
range, search range, doc; torch-free, the config reads it).

May import: torch (and torchmetrics, numpy) only; nothing else of gspo_bench.
This package's ``__init__`` imports none of its modules, so ``core/names.py``
and ``core/loss_params.py`` load without torch.
"""
