"""The training frameworks a plan is for, and how each expresses the plan on its command line.

One table (this package) that the search space (``search/space.py``: a search offers only configs its framework can
run) and the launch exporter (``app/formats/launch.py``: an export prints these flags) both read, so the two
cannot disagree. ``express(config, spec, framework)`` returns the flags of every choice the cost model
planned, and a ``Refusal`` for each choice the framework cannot carry out as planned; a non-empty
``refusals`` means the export refuses (never drops an option silently). A field at its default needs no
flag when the framework's own default does the same; a choice that has no effect on the model (an
all-to-all setting of a dense model, the param all-gather overlap without a sharded optimizer) needs none.

What each framework can express (``docs/search.md`` has the user-facing table):

=========================== ===================================== =======================================
choice                      Megatron-LM                           MindSpeed-LLM
=========================== ===================================== =======================================
selective recompute modules all (``--recompute-modules``)          core_attn, layernorm, mlp, moe through
                                                                  ``--recompute-modules`` (core 0.12.1);
                                                                  moe_act ``--recompute-activation-
                                                                  function``; mla_up_proj ``--recompute-
                                                                  mla-up-proj``; no shared_experts
full recompute, N per stage ``block`` with N / vpp per chunk when as Megatron, or N per pipeline rank
                            that recomputes N layers per stage    (``--enable-recompute-layers-per-pp-rank``)
pipeline split              every split (flags or layout string)  every split (no-op padding, else layout)
EP dispatch (searched)      flat ``alltoall``; hierarchical       flat ``alltoall``; no hierarchical
                            ``flex`` + DeepEP                     all-to-all (when EP leaves the node)
CP algorithm (searched)     ``--cp-comm-type`` (all four)         ``--context-parallel-algo`` (all four)
TP overlap                  ``--tp-comm-overlap``                 ``--use-ascend-mc2`` (not with the
                                                                  all-to-all overlap, not with fp8, not
                                                                  in MoE models: grouped GEMM)
EP all-to-all overlap       not with full recompute, the moe      ``--moe-alltoall-overlap-comm`` (not
                            module, MTP > 1, or pp > 1 without    with the moe module)
                            interleaving
model-state dtypes          precision-aware optimizer: bf16 main  ``--reuse-fp32-param`` (bf16 main
                            params (remainders), bf16 grads, any  params), ``--quant-states fp8`` (both
                            moment dtype                          moments fp8)
DP sharding                 all four (Megatron-FSDP for ZeRO-2/3) no_shard, optim
=========================== ===================================== =======================================

Sources read (file and commit):

* Megatron-LM: NVIDIA/Megatron-LM ``megatron/training/arguments.py`` at 67f3515c8a0539d38c23f59dd8b85efdcbb3af3d
  (the last commit that spells every flag as a literal ``add_argument``, as tests/test_launch.py does),
  and the checks of ``megatron/core/transformer/transformer_config.py``, ``megatron/training/arguments.py``
  and ``megatron/core/optimizer/`` at d98e8a64ddf34856e74b24714e3bedb2f5a39553 (called "HEAD" below).
* MindSpeed-LLM: Ascend/MindSpeed-LLM at c77308a14bfcb1aa7ca61da9c1aa24a893cb1b91, which runs on Megatron-LM
  core_v0.12.1 (a845aa7e12b3a117e24c2352b9e3e60bad2e3a17; docs/en/pytorch/training/install_guide.md) and
  Ascend/MindSpeed at 028de58ca629d035185b00ff7d1eb7eff4f7fd48. Only the features MindSpeed-LLM registers
  count (the lists in mindspeed_llm/features_manager/__init__.py); their ``validate_args`` run at start-up
  (mindspeed_llm/training/arguments.py ``validate_args_v2_decorator``), MindSpeed's legacy
  ``mindspeed/arguments.py`` checks do not.
The package by concern: ``table`` (framework names, the algorithms and dispatchers each can launch, the
field index, ``Refusal``), ``split`` (the pipeline split as each framework states it), ``options`` (every
other planned choice, for both frameworks), ``megatron`` and ``mindspeed`` (the rules only one framework
has), ``express`` (a whole config), ``flags`` (every launch flag read back: its field, or why it is ignored
or refused) and ``importer`` (a launch's arguments read back into a model spec and a training config, the
inverse of ``express`` and ``app/formats/launch.py``). Every public name is importable from ``search.frameworks``.
"""

from .express import Expression, express, refusals, split_refusals
from .importer import Imported, LaunchImportError, guess_framework, read_args
from .options import ep_leaves_domain, ulysses_degree
from .split import Split, layout_string, pipeline_split, stage_tokens
from .table import (ALGORITHMS, DISPATCHERS, FIELDS, FP8_CURRENT_SCALING_MODULES, FRAMEWORKS, LABELS,
                    MINDSPEED_CP_ALGO, MINDSPEED_MEGATRON_MODULES, MINDSPEED_MODULE_FLAGS, MINDSPEED_SWAP_MODULES,
                    InexpressibleError, Refusal, algorithm_values, default_framework)

__all__ = ["ALGORITHMS", "DISPATCHERS", "FIELDS", "FP8_CURRENT_SCALING_MODULES", "FRAMEWORKS", "LABELS",
           "MINDSPEED_CP_ALGO", "MINDSPEED_MEGATRON_MODULES", "MINDSPEED_MODULE_FLAGS", "MINDSPEED_SWAP_MODULES",
           "Expression", "Imported", "InexpressibleError", "LaunchImportError", "Refusal", "Split", "algorithm_values", "default_framework",
           "ep_leaves_domain", "express", "guess_framework", "layout_string", "pipeline_split", "read_args", "refusals", "split_refusals",
           "stage_tokens", "ulysses_degree"]
