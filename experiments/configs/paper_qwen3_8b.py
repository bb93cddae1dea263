"""The paper's settings for Qwen3-8B-Base on DAPO-Math (see `paper_qwen3.py`)."""

import ml_collections

from experiments.configs.paper_qwen3 import paper_config


def get_config() -> ml_collections.ConfigDict:
    return paper_config("8b")
