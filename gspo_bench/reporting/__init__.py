"""Reading results back: ``leaderboard``, ``report`` and its figures, tuning studies, ``bench`` tables."""
