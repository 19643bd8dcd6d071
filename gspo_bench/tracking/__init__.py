"""MLflow as the record of runs, and the only package that imports mlflow (an import-linter contract):
``client.py`` (the client, paged run searches and artifact access the packages above use), ``stores.py``
(the store as a shared, fallible resource: a lock per store, the artifact folder's check, the retry budget, a
dead server), ``lifecycle.py`` (who owns a RUNNING
run, which run ``--resume`` continues, the loggers of a run), ``runs.py`` (one training run's record as the
runner drives it: the console kept quiet, the run opened or continued, tagged and ended), ``ui.py`` (what
MLflow's UI shows: the experiment kind, run descriptions, links), ``redact.py`` (credentials masked in all
output), ``provenance.py`` (the commit and machine a run or results file came from).

May import: config, core, paths.
"""
