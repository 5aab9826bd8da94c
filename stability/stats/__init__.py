"""Statistics shared by the report (the answer) and the sweep (adaptive, decide): no MLflow, no I/O.

``paired``: seed statistics of two configs (means, paired tests, power, Holm).
``effects``: a factor's effect from every run of a study, seeds as blocks, and the
helps / hurts / equivalent / undecided decision rule.
``best``, ``cost``, ``choice``: a factor's level by multiple comparisons with the best, then cost.
``sequential``, ``looks``: the adaptive study's looks; ``shown``: the decide study's.
"""
