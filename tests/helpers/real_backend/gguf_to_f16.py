"""Rewrite a quantized GGUF model as F16: same metadata and tokenizer, every quantized
tensor dequantized (``gguf.quants.dequantize``) and stored as float16.

Why: the prebuilt llama-server's quantized CPU kernels compute garbage on some x86-64
CPUs (SmolLM2-135M Q4_1 answers nonsense at temperature 0 on this machine's AMD EPYC),
while its F16 path is right. ``setup.sh --with-smollm2`` runs this once and caches the
result beside the quantized file.

usage: python gguf_to_f16.py IN.gguf OUT.gguf
Needs ``gguf`` and ``numpy`` (the dev lock). Writes OUT.gguf.tmp, then renames it.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType, GGUFReader, GGUFValueType, GGUFWriter, LlamaFileType
from gguf.quants import dequantize

# Kept as they are: already float (norms and biases stay F32, as llama.cpp wants them).
_FLOAT_TYPES = {GGMLQuantizationType.F32, GGMLQuantizationType.F16, GGMLQuantizationType.BF16}
# Written by GGUFWriter itself (header counts, the architecture passed to its constructor).
_WRITER_OWNED = {"GGUF.version", "GGUF.tensor_count", "GGUF.kv_count", "general.architecture"}


def convert(source: Path, target: Path) -> int:
    """Write ``target`` from ``source``; returns how many tensors were dequantized."""
    reader = GGUFReader(source)
    arch = reader.fields["general.architecture"].contents()
    tmp = target.with_name(target.name + ".tmp")
    writer = GGUFWriter(tmp, arch)
    for key, field in reader.fields.items():
        if key in _WRITER_OWNED:
            continue
        if key == "general.file_type":
            writer.add_file_type(LlamaFileType.MOSTLY_F16)
            continue
        vtype = field.types[0]
        sub_type = field.types[-1] if vtype == GGUFValueType.ARRAY else None
        writer.add_key_value(key, field.contents(), vtype, sub_type=sub_type)
    converted = 0
    for tensor in reader.tensors:
        if tensor.tensor_type in _FLOAT_TYPES:
            data = np.asarray(tensor.data)
        else:
            data = dequantize(tensor.data, tensor.tensor_type).astype(np.float16)
            converted += 1
        # numpy order is GGUF's dimension order reversed, as GGUFWriter expects.
        writer.add_tensor(tensor.name, data.reshape(tuple(reversed(tensor.shape.tolist()))))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    os.replace(tmp, target)
    return converted


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    converted = convert(Path(argv[0]), Path(argv[1]))
    print(f"gguf_to_f16: {converted} tensors dequantized to F16 -> {argv[1]}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
