"""The command-line entry points: thin absl programs over one library function each.

transformers prints an advisory when it is imported without PyTorch ("PyTorch was not found.
Models won't be available ..."): gdro-jax uses only its tokenizers and configs, so the entry
points turn the advisory off, as transformers documents, unless the user set the variable.
"""

import os

os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
