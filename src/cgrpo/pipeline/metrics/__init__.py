"""Metrics on extracted answers and their intervals: accuracy (`accuracy`), conformal coverage (`coverage`),
confidence intervals (`statistics`) and their argument checks (`checks`). Pure functions, used by the jobs and the
analysis alike.
"""
