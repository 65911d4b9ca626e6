"""Search over the parallel-config space: an exhaustive enumerator (the ground truth where the space
can be enumerated) and Optuna samplers (TPE, NSGA-II, random), one study per search.

Built on ``costmodel`` only; it knows nothing of ``app``.
"""

from .engine import AUTO_EXHAUSTIVE_MAX, ENGINES, SearchRequest, run_search
from .space import SearchSpace, SpaceError, build_space, validate_fixed

__all__ = ["AUTO_EXHAUSTIVE_MAX", "ENGINES", "SearchRequest", "SearchSpace", "SpaceError", "build_space",
           "run_search", "validate_fixed"]
