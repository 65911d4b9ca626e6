"""Search over the parallel-config space (Optuna samplers and an exhaustive enumerator).

Built on ``costmodel`` only; it knows nothing of ``app``. The engines arrive with the search issue.
"""
