"""Prints the memory footprint of the Qwen3 presets per mesh shape, from `jax.eval_shape` only.

  python -m gdro_jax.models.footprint
  python -m gdro_jax.models.footprint --preset qwen3_8b --mesh 1x8x1 --mesh 2x2x2 \
      --dtype bfloat16 --batch 256 --seq-len 4352
"""

from __future__ import annotations

import argparse

from gdro_jax.models._config import DecoderConfig
from gdro_jax.models._footprint import memory_footprint

PRESETS = ("qwen3_0p6b", "qwen3_1p7b", "qwen3_4b", "qwen3_8b")
_GIB = 1024**3


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", action="append", choices=PRESETS, help="default: all")
    parser.add_argument(
        "--mesh",
        action="append",
        help="DATAxFSDPxTENSOR, e.g. 1x8x1 (default: 1x1x1 1x8x1 2x4x1 1x4x2)",
    )
    parser.add_argument("--dtype", default="bfloat16", help="parameter and compute dtype")
    parser.add_argument("--batch", type=int, default=64, help="sequences in the KV cache")
    parser.add_argument("--seq-len", type=int, default=4096, help="cache slots per sequence")
    args = parser.parse_args(argv)
    meshes = args.mesh or ["1x1x1", "1x8x1", "2x4x1", "1x4x2"]
    print(
        f"dtype={args.dtype}  KV cache: batch {args.batch} x {args.seq_len} slots  "
        "(GiB per device; AdamW moments in float32)"
    )
    columns = ("weights", "adam", "kv cache", "total")
    print(f"{'preset':<12}{'params':>10}{'mesh':>8}" + "".join(f"{c:>10}" for c in columns))
    for preset in args.preset or PRESETS:
        config = getattr(DecoderConfig, preset)(param_dtype=args.dtype, compute_dtype=args.dtype)
        for mesh in meshes:
            data, fsdp, tensor = (int(x) for x in mesh.split("x"))
            f = memory_footprint(
                config, data=data, fsdp=fsdp, tensor=tensor, batch=args.batch, seq_len=args.seq_len
            )
            parts = (f.param_bytes_per_device, f.adam_bytes_per_device, f.kv_cache_bytes_per_device)
            print(
                f"{preset:<12}{f.param_count / 1e9:>9.2f}B{mesh:>8}"
                + "".join(f"{p / _GIB:>10.2f}" for p in parts)
                + f"{sum(parts) / _GIB:>10.2f}"
            )


if __name__ == "__main__":
    main()
