"""From records to results: the tables (`reporting`, with the comparisons in `comparison` and the training frontier
in `frontier`), the figures (`plots`), the compute-matched group size (`matching`) and the exact replay of every
stopping rule on an evaluated model's samples (`replay`).

It reads what the jobs wrote; no job imports it.
"""
