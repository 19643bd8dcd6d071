"""The command line: ``main.py`` (the parser, the table of subcommands, errors as one line), ``run.py``
(``run``'s body and what a signal's stop prints), ``info.py`` (``list``, ``leaderboard``, ``collapse-check``,
``claims``), ``measure.py`` (``bench`` and ``warmstart``), ``environment.py`` (torch's companion packages must
import, checked before every command).

May import: every other package (it is the top layer).
"""
