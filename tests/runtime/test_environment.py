"""`runtime.environment`: the record of the machine and versions every result file carries."""

import json
import pathlib
import platform
import re

import flax
import jax
import numpy as np
import optax
import pytest

from gdro_jax import runtime

# The first processor of an x86 /proc/cpuinfo (shortened), then the second's start.
X86 = """processor\t: 0
vendor_id\t: GenuineIntel
model name\t: Intel(R) Xeon(R) Platinum 8480C
flags\t\t: fpu vme sse sse2 ssse3 fma cx16 sse4_1 sse4_2 popcnt avx f16c avx2 avx512f \
avx512bw avx512_bf16 amx_tile misalignsse lahf_lm
bogomips\t: 4000.00

processor\t: 1
model name\t: another model
flags\t\t: fpu avx512_fp16
"""
# An ARM /proc/cpuinfo: no model name, features under `Features`.
ARM = """processor\t: 0
BogoMIPS\t: 2000.00
Features\t: fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp sve sve2
CPU implementer\t: 0x41
CPU part\t: 0xd4f

"""


def test_x86_model_and_vector_extensions_come_from_the_first_processor():
    cpu = runtime.cpu_description(X86)
    assert cpu["model"] == "Intel(R) Xeon(R) Platinum 8480C"
    assert cpu["source"] == "/proc/cpuinfo"
    # By hand: the SIMD flags of the first block, sorted; not misalignsse, not the second block's.
    assert cpu["vector_extensions"] == [
        "amx_tile", "avx", "avx2", "avx512_bf16", "avx512bw", "avx512f", "f16c", "fma", "sse",
        "sse2", "sse4_1", "sse4_2", "ssse3",
    ]  # fmt: skip


def test_arm_features_and_cpu_part_name_the_cpu():
    cpu = runtime.cpu_description(ARM)
    assert cpu["model"] == "CPU implementer 0x41 CPU part 0xd4f"
    assert cpu["vector_extensions"] == ["asimd", "asimdhp", "sve", "sve2"]


def test_without_cpuinfo_the_platform_names_the_cpu():
    cpu = runtime.cpu_description("")
    assert cpu["source"] == "platform" and cpu["vector_extensions"] == []
    assert cpu["model"] in (platform.processor(), platform.machine())


def test_the_record_names_versions_backend_devices_and_this_cpu():
    record = runtime.environment()
    json.dumps(record)  # JSON-ready
    # Versions from each module's own attribute, not from the package metadata the code reads.
    assert record["packages"]["jax"] == jax.__version__
    assert record["packages"]["flax"] == flax.__version__
    assert record["packages"]["optax"] == optax.__version__
    assert record["packages"]["numpy"] == np.__version__
    assert record["python"] == ".".join(map(str, __import__("sys").version_info[:3]))
    # conftest: 8 fake CPU devices.
    assert record["backend"] == "cpu"
    assert record["devices"] == {"count": 8, "kind": "cpu", "processes": 1}
    cpuinfo = pathlib.Path("/proc/cpuinfo")
    if not cpuinfo.is_file():
        pytest.skip("no /proc/cpuinfo: the platform fallback is tested above")
    text = cpuinfo.read_text()
    flags = set(re.search(r"^(?:flags|Features)\s*:(.*)$", text, re.M).group(1).split())
    avx = {f for f in flags if f.startswith("avx")}
    assert avx <= set(record["cpu"]["vector_extensions"])
    assert not set(record["cpu"]["vector_extensions"]) - flags
    model = re.search(r"^model name\s*:\s*(.*)$", text, re.M)
    if model:
        assert record["cpu"]["model"] == model.group(1).strip()
