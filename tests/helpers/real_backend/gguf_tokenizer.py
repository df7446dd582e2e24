"""Write a Hugging Face ``tokenizer.json`` from the byte-level BPE tokenizer inside a GGUF.

Benchmark clients that count tokens (llama-benchy) need the served model's tokenizer
and must not fetch it from a hub; the GGUF already holds it (``tokenizer.ggml.*``).
Handles ``tokenizer.ggml.model == "gpt2"`` (byte-level BPE: SmolLM2, Llama 3, Qwen).

usage: python gguf_tokenizer.py MODEL.gguf OUT_DIR
Needs ``gguf`` and ``tokenizers`` (the dev lock). Writes OUT_DIR/tokenizer.json and
OUT_DIR/tokenizer_config.json.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from gguf import GGUFReader
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors

_CONTROL, _USER_DEFINED = 3, 4  # llama.cpp token types that are added/special tokens


def write_tokenizer(model: Path, out: Path) -> int:
    """Write the files; returns the vocabulary size."""
    reader = GGUFReader(model)

    def field(name: str) -> Any:
        found = reader.fields.get(name)
        return None if found is None else found.contents()

    kind = field("tokenizer.ggml.model")
    if kind != "gpt2":
        raise ValueError(f"{model}: only byte-level BPE (gpt2) tokenizers, got {kind!r}")
    tokens: list[str] = field("tokenizer.ggml.tokens")
    types: list[int] = field("tokenizer.ggml.token_type") or [1] * len(tokens)
    merges = [tuple(m.split(" ", 1)) for m in field("tokenizer.ggml.merges")]
    bpe = models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=merges, fuse_unk=False)
    tokenizer = Tokenizer(bpe)
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    tokenizer.add_tokens(
        [
            AddedToken(token, special=kind_ == _CONTROL, normalized=False)
            for token, kind_ in zip(tokens, types, strict=True)
            if kind_ in (_CONTROL, _USER_DEFINED)
        ]
    )
    out.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(out / "tokenizer.json"))
    arch = field("general.architecture")
    config: dict[str, Any] = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "model_max_length": int(field(f"{arch}.context_length") or 2048),
    }
    for key, name in (("bos_token", "bos"), ("eos_token", "eos"), ("pad_token", "padding")):
        index = field(f"tokenizer.ggml.{name}_token_id")
        if index is not None and 0 <= int(index) < len(tokens):
            config[key] = tokens[int(index)]
    template = field("tokenizer.chat_template")
    if template:
        config["chat_template"] = template
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
    return len(tokens)


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    size = write_tokenizer(Path(argv[0]), Path(argv[1]))
    print(f"gguf_tokenizer: {size} tokens -> {argv[1]}/tokenizer.json", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
