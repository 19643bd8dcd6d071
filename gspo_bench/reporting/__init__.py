"""Reading results back from MLflow: the leaderboard, paired differences, the compute-scaling fits, the report
and its figures, the tuning studies, the suite summary, the claims and the collapse-detector replay.

May import: bench, tuning, train and everything below (``reporting/study.py`` opens
Optuna storages through ``tuning``); ``reporting/leaderboard.py`` itself stays
torch-free, so reading a leaderboard is quick.
"""
