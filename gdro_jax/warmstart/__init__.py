"""The supervised warm start: a chain-task policy that already solves easy problems (SPEC 11).

`pretrain(config, workdir)` trains it by teacher forcing on worked solutions (or reuses a folder
trained with the same config), evaluates it on the validation split and checks SPEC 11's
frontier; `pretrain_model` is the training alone. Its loss, `losses.masked_cross_entropy`, lives
with the other losses.
"""

from gdro_jax.warmstart._pretrain import (
    CONFIG_FILE,
    FRONTIER_FILE,
    TOKENIZER_DIR,
    PretrainResult,
    check_frontier,
    config_hash,
    decoder_config,
    pretrain,
    pretrain_model,
    supervised_loss,
    task_config,
)

__all__ = [
    "CONFIG_FILE",
    "FRONTIER_FILE",
    "TOKENIZER_DIR",
    "PretrainResult",
    "check_frontier",
    "config_hash",
    "decoder_config",
    "pretrain",
    "pretrain_model",
    "supervised_loss",
    "task_config",
]
