"""The flag table: every launch flag ParaPlan reads, what it means in ModelSpec / TrainingConfig terms, and
the flags it knows and ignores or refuses.

The export (``express`` and ``app/formats/launch.py``) writes these flags; the import (``importer``) reads
them back through this table and the decoders beside it, and ``tests/test_launch_import.py`` holds the two
to each other: every flag an export of any preset's ranked configs writes is in this table, and importing
the export gives the config back. Flags a team's script carries that do not change the plan (logging,
paths, data, learning rate, fused kernels) are ``IGNORED`` with the reason; flags that change speed or
memory in a way the cost model does not price are ``REFUSED`` with the reason, so that an estimate never
silently leaves them out. Anything else is unknown and refused.

Defaults of an absent flag are Megatron-LM's (megatron/training/arguments.py at core_v0.12.1, which
MindSpeed-LLM runs, and d98e8a64): GPT-2's architecture (LayerNorm, learned absolute positions, biases on,
GeLU, tied embeddings, top-2 softmax router), no sequence parallelism, no distributed optimizer, no
overlaps, etp = tp.
"""

from __future__ import annotations

# Model flags taking one integer: flag -> ModelSpec field. MindSpeed-LLM's DeepSeek-style names
# (mindspeed_llm features_manager MLA and MoE features: --qk-nope-head-dim, --qk-rope-head-dim,
# --moe-intermediate-size, --n-group, --topk-group) are its spellings of the same fields.
SPEC_INT = {
    "--num-layers": "num_layers", "--hidden-size": "hidden_size", "--ffn-hidden-size": "ffn_hidden_size",
    "--num-attention-heads": "num_attention_heads", "--num-query-groups": "num_query_groups",
    "--kv-channels": "kv_channels", "--seq-length": "seq_length", "--q-lora-rank": "q_lora_rank",
    "--kv-lora-rank": "kv_lora_rank", "--qk-head-dim": "qk_head_dim", "--qk-nope-head-dim": "qk_head_dim",
    "--qk-pos-emb-head-dim": "qk_pos_emb_head_dim", "--qk-rope-head-dim": "qk_pos_emb_head_dim",
    "--v-head-dim": "v_head_dim", "--num-experts": "num_experts", "--moe-router-topk": "moe_router_topk",
    "--moe-ffn-hidden-size": "moe_ffn_hidden_size", "--moe-intermediate-size": "moe_ffn_hidden_size",
    "--moe-shared-expert-intermediate-size": "moe_shared_expert_intermediate_size",
    "--mtp-num-layers": "mtp_num_layers", "--rotary-base": "rotary_base",
    "--moe-router-num-groups": "moe_router_num_groups", "--n-group": "moe_router_num_groups",
    "--moe-router-group-topk": "moe_router_group_topk", "--topk-group": "moe_router_group_topk",
}
# Model flags taking one number.
SPEC_FLOAT = {
    "--moe-router-topk-scaling-factor": "moe_router_topk_scaling_factor",
    "--routed-scaling-factor": "moe_router_topk_scaling_factor",
    "--rotary-scaling-factor": "rotary_scaling_factor", "--mscale": "mscale", "--mscale-all-dim": "mscale_all_dim",
    "--output-logit-softcapping": "final_logit_softcapping", "--attn-logit-softcapping": "attn_logit_softcapping",
}
# Model flags taking one of a few words.
SPEC_CHOICE = {
    "--normalization": ("normalization", ("LayerNorm", "RMSNorm")),
    "--position-embedding-type": ("position_embedding_type", ("rope", "learned_absolute", "none")),
    "--moe-router-score-function": ("moe_router_score_function", ("softmax", "sigmoid")),
}
# Model switches: flag -> (field, value when given).
SPEC_SWITCH = {
    "--swiglu": ("swiglu", True), "--untie-embeddings-and-output-weights": ("untie_embeddings_and_output_weights", True),
    "--multi-latent-attention": ("multi_latent_attention", True),
    "--multi-head-latent-attention": ("multi_latent_attention", True),
    "--disable-bias-linear": ("add_bias_linear", False), "--add-qkv-bias": ("add_qkv_bias", True),
    "--qk-layernorm": ("qk_layernorm", True), "--moe-router-pre-softmax": ("moe_router_pre_softmax", True),
    "--moe-router-enable-expert-bias": ("moe_router_enable_expert_bias", True),
    "--no-bias-swiglu-fusion": ("bias_activation_fusion", False),
    "--no-bias-gelu-fusion": ("bias_activation_fusion", False),
}
# The same model, Megatron-LM's defaults when the flag is absent (arguments.py).
SPEC_DEFAULTS = {"swiglu": False, "untie_embeddings_and_output_weights": False, "normalization": "LayerNorm",
                 "position_embedding_type": "learned_absolute", "add_bias_linear": True, "moe_router_topk": 2}

# Training flags taking one integer: flag -> TrainingConfig field.
CONFIG_INT = {
    "--tensor-model-parallel-size": "tp", "--pipeline-model-parallel-size": "pp",
    "--context-parallel-size": "cp", "--expert-model-parallel-size": "ep",
    "--expert-tensor-parallel-size": "etp", "--micro-batch-size": "micro_batch_size",
    "--global-batch-size": "global_batch_size",
}
# Training switches: flag -> (field, value when given); absent, the field takes Megatron's default below.
CONFIG_SWITCH = {
    "--sequence-parallel": ("sequence_parallel", True), "--use-distributed-optimizer": ("distributed_optimizer", True),
    "--overlap-grad-reduce": ("overlap_grad_reduce", True), "--overlap-param-gather": ("overlap_param_gather", True),
    "--tp-comm-overlap": ("tp_comm_overlap", True), "--use-ascend-mc2": ("tp_comm_overlap", True),
    "--overlap-moe-expert-parallel-comm": ("moe_a2a_overlap", True),
    "--moe-alltoall-overlap-comm": ("moe_a2a_overlap", True), "--moe-fb-overlap": ("moe_a2a_overlap", True),
    "--delay-wgrad-compute": ("delay_wgrad_compute", True), "--mla-fa-without-pad": ("mla_fa_without_pad", True),
    "--account-for-embedding-in-pipeline-split": ("account_for_embedding_in_pipeline_split", True),
    "--account-for-loss-in-pipeline-split": ("account_for_loss_in_pipeline_split", True),
}
CONFIG_DEFAULTS = {"sequence_parallel": False, "distributed_optimizer": False, "overlap_grad_reduce": False,
                   "overlap_param_gather": False}

# Flags read by the decoders of importer.py (each with its arity: 0 a switch, 1 one value, "+" one or more).
DECODED = {
    "--vocab-size": 1, "--padded-vocab-size": 1, "--make-vocab-size-divisible-by": 1, "--group-query-attention": 0,
    "--moe-layer-freq": 1, "--first-k-dense-replace": 1, "--n-shared-experts": 1, "--noop-layers": 1,
    "--geglu": 0, "--gelu-tanh": 0,
    "--rope-scaling-type": 1, "--rope-scaling-factor": 1, "--rope-scaling-mscale": 1,
    "--rope-scaling-mscale-all-dim": 1, "--rope-scaling-original-max-position-embeddings": 1,
    "--num-layers-per-virtual-pipeline-stage": 1, "--num-virtual-stages-per-pipeline-rank": 1,
    "--decoder-first-pipeline-num-layers": 1, "--decoder-last-pipeline-num-layers": 1,
    "--pipeline-model-parallel-layout": 1, "--schedules-method": 1,
    "--recompute-granularity": 1, "--recompute-method": 1, "--recompute-num-layers": 1, "--recompute-modules": "+",
    "--recompute-activation-function": 0, "--recompute-mla-up-proj": 0, "--mla-up-proj-tp-overlap": 0,
    "--mla-mm-split": 0, "--enable-recompute-layers-per-pp-rank": 0,
    "--fine-grained-activation-offloading": 0, "--offload-modules": "+", "--swap-attention": 0, "--swap-modules": 1,
    "--use-megatron-fsdp": 0, "--data-parallel-sharding-strategy": 1, "--megatron-fsdp-main-grads-dtype": 1,
    "--use-precision-aware-optimizer": 0, "--main-grads-dtype": 1, "--main-params-dtype": 1, "--exp-avg-dtype": 1,
    "--exp-avg-sq-dtype": 1, "--reuse-fp32-param": 0, "--quant-states": 1,
    "--cp-comm-type": 1, "--hierarchical-context-parallel-sizes": "+", "--context-parallel-algo": 1,
    "--ulysses-degree-in-cp": 1, "--attention-backend": 1, "--use-flash-attn": 0,
    "--moe-token-dispatcher-type": 1, "--moe-flex-dispatcher-backend": 1, "--moe-enable-deepep": 0,
    "--moe-hierarchical-alltoallv": 0, "--moe-grouped-gemm": 0, "--moe-tp-extend-ep": 0,
    "--bf16": 0, "--fp16": 0, "--fp8-format": 1, "--fp8-recipe": 1,
}

# Flags that do not change the plan: the reason, printed as a note.
_IGNORED_GROUPS = {
    "logging, checkpoints and evaluation": (
        "--log-interval", "--log-throughput", "--log-timers-to-tensorboard", "--log-validation-ppl-to-tensorboard",
        "--log-memory-to-tensorboard", "--log-num-zeros-in-grad", "--log-params-norm", "--timing-log-level",
        "--tensorboard-dir", "--tensorboard-log-interval", "--wandb-project", "--wandb-exp-name", "--wandb-save-dir",
        "--save", "--load", "--save-interval", "--eval-interval", "--eval-iters", "--no-save-optim", "--no-save-rng",
        "--no-load-optim", "--no-load-rng", "--ckpt-format", "--use-checkpoint-args", "--exit-on-missing-checkpoint",
        "--finetune", "--exit-interval", "--exit-duration-in-mins", "--profile", "--profile-step-start",
        "--profile-step-end", "--use-pytorch-profiler", "--profile-ranks", "--async-save", "--use-dist-ckpt",
        "--auto-detect-ckpt-format", "--ckpt-fully-parallel-save", "--ckpt-fully-parallel-load", "--no-shared-storage",
        "--rerun-mode", "--distributed-timeout-minutes", "--distributed-backend", "--seed"),
    "data and tokenizer (the plan reads the sequence length and the vocabulary only)": (
        "--data-path", "--train-data-path", "--valid-data-path", "--test-data-path", "--split", "--mock-data",
        "--data-cache-path", "--dataloader-type", "--num-workers", "--tokenizer-type", "--tokenizer-model",
        "--tokenizer-name-or-path", "--tiktoken-pattern", "--no-create-attention-mask-in-dataloader",
        "--no-mmap-bin-files", "--reset-position-ids", "--reset-attention-mask", "--eod-mask-loss",
        "--max-position-embeddings", "--prompt-type", "--is-instruction-dataset", "--variable-seq-lengths",
        "--padded-samples", "--no-pad-to-seq-lengths", "--append-eod"),
    "training hyper-parameters, losses and numerics (not the step time)": (
        "--lr", "--min-lr", "--lr-decay-style", "--lr-decay-iters", "--lr-decay-samples", "--lr-warmup-iters",
        "--lr-warmup-samples", "--lr-warmup-fraction", "--lr-warmup-init", "--decoupled-lr", "--decoupled-min-lr",
        "--train-iters", "--train-samples", "--weight-decay", "--clip-grad", "--adam-beta1", "--adam-beta2",
        "--adam-eps", "--optimizer", "--initial-loss-scale", "--loss-scale", "--init-method-std", "--attention-dropout",
        "--hidden-dropout", "--norm-epsilon", "--moe-aux-loss-coeff", "--moe-z-loss-coeff", "--seq-aux",
        "--norm-topk-prob", "--moe-router-load-balancing-type", "--moe-router-bias-update-rate",
        "--mtp-loss-scaling-factor", "--router-gating-in-fp32", "--moe-router-dtype", "--calculate-per-token-loss",
        "--rotary-percent", "--apply-layernorm-1p", "--rope-scaling-beta-fast", "--rope-scaling-beta-slow",
        "--no-rope-fusion", "--use-rotary-position-embeddings", "--no-position-embedding",
        "--fp8-amax-history-len", "--fp8-amax-compute-algo", "--fp8-margin", "--fp8-interval", "--fp8-param-gather",
        "--attention-softmax-in-fp32", "--accumulate-allreduce-grads-in-fp32", "--spec", "--use-mcore-models",
        "--transformer-impl", "--use-legacy-models", "--micro-batch-size-per-dp"),
    "kernel fusions and runtime settings (the cost model's efficiencies assume the fused kernels)": (
        "--use-fused-rmsnorm", "--use-fused-swiglu", "--use-fused-rotary-pos-emb", "--no-masked-softmax-fusion",
        "--masked-softmax-fusion", "--no-gradient-accumulation-fusion", "--gemm-gradient-accumulation-fusion",
        "--cross-entropy-loss-fusion", "--manual-gc", "--manual-gc-interval", "--empty-unused-memory-level",
        "--moe-permutation-async-comm", "--no-async-tensor-model-parallel-allreduce", "--use-cpu-initialization",
        "--mtp-mem-efficient-logits", "--use-ascend-coc", "--coc-fused-kernel", "--npu-deterministic",
        "--use-deter-comp", "--jit-compile", "--bias-dropout-fusion", "--no-bias-dropout-fusion",
        "--use-contiguous-parameters-in-local-ddp", "--ddp-bucket-size", "--recompute-in-advance",
        "--moe-zero-memory", "--moe-zero-memory-num-layers"),
}
IGNORED = {flag: why for why, names in _IGNORED_GROUPS.items() for flag in names}

# Flags that change speed or memory in ways the cost model does not price: refused with the reason.
REFUSED = {
    "--fp16": "fp16 training is not modelled (ParaPlan plans bf16, and fp8 on top of it)",
    "--swap-optimizer": "optimizer-state swapping to the host is not modelled: the estimate would count the "
                        "optimizer states on the device",
    "--use-torch-fsdp2": "PyTorch FSDP2 is not modelled (Megatron-FSDP is: --use-megatron-fsdp)",
    "--moe-expert-capacity-factor": "token dropping (an expert capacity) is not modelled",
    "--moe-pad-expert-input-to-capacity": "token dropping (an expert capacity) is not modelled",
    "--cpu-offloading": "Transformer Engine's layer CPU offloading is not modelled (fine-grained activation "
                        "offloading is: --fine-grained-activation-offloading)",
    "--grad-reduce-in-bf16": "bf16 gradient reduction outside the precision-aware optimizer is not mapped "
                             "(--use-precision-aware-optimizer --main-grads-dtype bf16 is)",
    "--decoder-seq-length": "encoder-decoder models are not modelled",
    "--num-layers-per-virtual-pipeline-stage-list": "per-stage virtual sizes are not mapped (use a layout)",
}


def known(flag: str) -> bool:
    """Whether the table reads ``flag`` (a mapped, decoded, ignored or refused flag)."""
    return any(flag in t for t in (SPEC_INT, SPEC_FLOAT, SPEC_CHOICE, SPEC_SWITCH, CONFIG_INT, CONFIG_SWITCH,
                                   DECODED, IGNORED, REFUSED))


def arity(flag: str) -> int | str | None:
    """How many values ``flag`` takes: 0, 1 or "+" (None: any, an ignored flag's)."""
    if flag in SPEC_SWITCH or flag in CONFIG_SWITCH:
        return 0
    if flag in SPEC_INT or flag in SPEC_FLOAT or flag in SPEC_CHOICE or flag in CONFIG_INT:
        return 1
    return DECODED.get(flag)
