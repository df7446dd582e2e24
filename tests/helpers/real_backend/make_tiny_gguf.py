"""Write a tiny random-weight llama GGUF (about 1 MB) that a real llama-server can load.

Adapted from the team's reference tool ``shared/real-backends/make_tiny_gguf.py``
(same architecture, tokenizer rules and logit-bias trick; typed and restructured
here so the project owns it). No network and no torch: it needs ``gguf``,
``tokenizers`` and ``numpy`` from the dev lock.

The byte-level BPE tokenizer is trained on a local text file, so llama.cpp and the
HF ``tokenizer.json`` written next to the model tokenize identically (benchmark
clients can count tokens exactly).

Usage: ``python make_tiny_gguf.py OUT_DIR [CORPUS_TXT]`` writes
``OUT_DIR/tiny-llama.gguf`` and ``OUT_DIR/tokenizer/{tokenizer.json,tokenizer_config.json}``.

``TINY_EOS_BIAS=<logit offset>`` (e.g. ``2.0``) lets the model emit EOS now and then;
by default EOS is banned, so every request runs to ``max_tokens`` like ``ignore_eos``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import gguf
import numpy as np
import numpy.typing as npt
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

VOCAB_SIZE = 1024
N_EMBD = 64
N_HEAD = 4
N_HEAD_KV = 2
N_FF = 192
N_LAYER = 2
N_CTX = 4096
SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
CHAT_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + "
    "message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
# Residual-stream channel 0 is a constant "bias" channel (embedding value BIAS_C, never
# written by any layer), so column 0 of output.weight acts as a per-token logit bias.
# It bans byte tokens that are not valid UTF-8 on their own (llama-server's OpenAI
# endpoints answer HTTP 500 on invalid UTF-8 in non-streaming responses) and control
# tokens, and bans EOS unless TINY_EOS_BIAS is set.
BIAS_C = 0.1
BAN = -20.0
# Channel 0 is about 4.27 after the final RMSNorm, so a logit offset L needs L / 4.27.
BIAS_CHANNEL_AFTER_NORM = 4.27
DEFAULT_CORPUS = Path("/usr/share/common-licenses/GPL-3")

FloatArray = npt.NDArray[np.float32]


def default_corpus() -> Path:
    """A local English text to train the tokenizer on (Debian's GPL-3, else argparse.py)."""
    if DEFAULT_CORPUS.is_file():
        return DEFAULT_CORPUS
    return Path(argparse.__file__)


def train_tokenizer(corpus: Path) -> Tokenizer:
    """A GPT-2 style byte-level BPE; llama.cpp's "gpt2" model + "gpt-2" pre-tokenizer match it."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=list(SPECIALS),
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train([str(corpus)], trainer)
    return tok


def decodes_alone(token: str) -> bool:
    """True when the token is printable, valid UTF-8 text by itself (safe to emit)."""
    if token in SPECIALS:
        return False
    text = decoders.ByteLevel().decode([token])
    return "\ufffd" not in text and all(c.isprintable() or c in "\n\t" for c in text)


def write_tokenizer_files(tok: Tokenizer, out: Path) -> None:
    """The HF tokenizer files benchmark clients load next to the model."""
    tok_dir = out / "tokenizer"
    tok_dir.mkdir(parents=True, exist_ok=True)
    tok.save(str(tok_dir / "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": "<|im_start|>",
        "eos_token": "<|im_end|>",
        "unk_token": "<|endoftext|>",
        "pad_token": "<|endoftext|>",
        "model_max_length": N_CTX,
        "chat_template": CHAT_TEMPLATE,
    }
    (tok_dir / "tokenizer_config.json").write_text(json.dumps(config, indent=1), encoding="utf-8")


def write_model(tok: Tokenizer, path: Path, eos_bias: float | None) -> str:
    """Write the GGUF and return a one-line summary."""
    tj = json.loads(tok.to_str())
    vocab: dict[str, int] = tj["model"]["vocab"]
    merges = [m if isinstance(m, str) else " ".join(m) for m in tj["model"]["merges"]]
    tokens = [t for t, _ in sorted(vocab.items(), key=lambda kv: kv[1])]
    if [vocab[t] for t in tokens] != list(range(len(tokens))):
        raise ValueError("tokenizer ids are not dense")
    n_vocab = len(tokens)
    types = [gguf.TokenType.CONTROL if t in SPECIALS else gguf.TokenType.NORMAL for t in tokens]
    eot, bos, eos = vocab["<|endoftext|>"], vocab["<|im_start|>"], vocab["<|im_end|>"]

    rng = np.random.default_rng(0)

    def weights(*shape: int, scale: float = 0.02) -> FloatArray:
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    head_dim = N_EMBD // N_HEAD
    wr = gguf.GGUFWriter(str(path), "llama")
    wr.add_name("tiny-llama-random")
    wr.add_context_length(N_CTX)
    wr.add_embedding_length(N_EMBD)
    wr.add_block_count(N_LAYER)
    wr.add_feed_forward_length(N_FF)
    wr.add_head_count(N_HEAD)
    wr.add_head_count_kv(N_HEAD_KV)
    wr.add_rope_dimension_count(head_dim)
    wr.add_rope_freq_base(10000.0)
    wr.add_layer_norm_rms_eps(1e-5)
    wr.add_vocab_size(n_vocab)
    wr.add_file_type(gguf.LlamaFileType.ALL_F32)
    wr.add_tokenizer_model("gpt2")
    wr.add_tokenizer_pre("gpt-2")
    wr.add_token_list(tokens)
    wr.add_token_types(types)
    wr.add_token_merges(merges)
    wr.add_bos_token_id(bos)
    wr.add_eos_token_id(eos)
    wr.add_eot_token_id(eos)
    wr.add_unk_token_id(eot)
    wr.add_pad_token_id(eot)
    wr.add_add_bos_token(False)
    wr.add_chat_template(CHAT_TEMPLATE)
    # numpy shape is (rows=out_features, cols=in_features); ggml's ne is reversed.
    emb = weights(n_vocab, N_EMBD)
    emb[:, 0] = BIAS_C
    out_w = weights(n_vocab, N_EMBD, scale=0.1)
    out_w[:, 0] = 0.0
    banned = [i for i, t in enumerate(tokens) if not decodes_alone(t)]
    out_w[banned, 0] = BAN
    if eos_bias is not None:
        out_w[eos, 0] = eos_bias / BIAS_CHANNEL_AFTER_NORM
    wr.add_tensor("token_embd.weight", emb)
    wr.add_tensor("output_norm.weight", np.ones(N_EMBD, np.float32))
    wr.add_tensor("output.weight", out_w)
    for i in range(N_LAYER):
        p = f"blk.{i}."
        wr.add_tensor(p + "attn_norm.weight", np.ones(N_EMBD, np.float32))
        wr.add_tensor(p + "attn_q.weight", weights(N_EMBD, N_EMBD))
        wr.add_tensor(p + "attn_k.weight", weights(N_HEAD_KV * head_dim, N_EMBD))
        wr.add_tensor(p + "attn_v.weight", weights(N_HEAD_KV * head_dim, N_EMBD))
        attn_out = weights(N_EMBD, N_EMBD)
        attn_out[0, :] = 0.0  # never write the bias channel
        wr.add_tensor(p + "attn_output.weight", attn_out)
        wr.add_tensor(p + "ffn_norm.weight", np.ones(N_EMBD, np.float32))
        wr.add_tensor(p + "ffn_gate.weight", weights(N_FF, N_EMBD))
        wr.add_tensor(p + "ffn_up.weight", weights(N_FF, N_EMBD))
        ffn_down = weights(N_EMBD, N_FF)
        ffn_down[0, :] = 0.0  # never write the bias channel
        wr.add_tensor(p + "ffn_down.weight", ffn_down)
    wr.write_header_to_file()
    wr.write_kv_data_to_file()
    wr.write_tensors_to_file()
    wr.close()
    eos_note = "banned" if eos_bias is None else f"bias {eos_bias}"
    return (
        f"wrote {path} ({path.stat().st_size} bytes): banned_from_output={len(banned)} "
        f"(eos {eos_note}) vocab={n_vocab} merges={len(merges)} embd={N_EMBD} "
        f"layers={N_LAYER} heads={N_HEAD}/{N_HEAD_KV} ff={N_FF}"
    )


def main(argv: list[str] | None = None) -> int:
    """Command line entry point; returns the exit code."""
    parser = argparse.ArgumentParser(description="Write a tiny random-weight llama GGUF.")
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("corpus", type=Path, nargs="?", default=None)
    args = parser.parse_args(argv)
    out: Path = args.out_dir
    corpus: Path = args.corpus if args.corpus is not None else default_corpus()
    raw_bias = os.environ.get("TINY_EOS_BIAS")
    eos_bias = float(raw_bias) if raw_bias is not None else None
    out.mkdir(parents=True, exist_ok=True)
    tok = train_tokenizer(corpus)
    write_tokenizer_files(tok, out)
    print(write_model(tok, out / "tiny-llama.gguf", eos_bias))
    return 0


if __name__ == "__main__":
    sys.exit(main())
