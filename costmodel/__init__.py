"""ParaPlan's analytical cost model: numpy, no I/O, vectorised over batches of configs.

``evaluate`` scores one config and returns the contract's result dict; ``evaluate_batch`` scores a
:class:`ConfigBatch` (arrays in, arrays out) and is what searches call.
"""

from .batch import ConfigBatch, DEFAULT_MOE_LOAD_IMBALANCE
from .evaluate import BatchResult, evaluate_batch
from .flops import model_flops_per_token, total_params
from .result import evaluate, evaluate_many
from .spec import ClusterProfile, ModelSpec, TrainingConfig
from . import rl  # noqa: E402 - the RL step (rollout, log-probs, training, hand-over)

__all__ = ["BatchResult", "ClusterProfile", "ConfigBatch", "DEFAULT_MOE_LOAD_IMBALANCE", "ModelSpec",
           "TrainingConfig", "evaluate", "evaluate_batch", "evaluate_many", "model_flops_per_token",
           "total_params"]
