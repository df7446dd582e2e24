"""Write the top-level request fields of vLLM's and SGLang's OpenAI-compatible request
models, read from their protocol files without importing them (no vLLM or SGLang needed).

Run once per upgrade, on the files unpacked from the released wheels:

    pip download --no-deps vllm==0.34.0 sglang==0.5.23 -d /tmp/up
    unzip /tmp/up/vllm-*.whl 'vllm/entrypoints/*protocol*.py' -d /tmp/up/src
    unzip /tmp/up/sglang-*.whl 'sglang/srt/entrypoints/openai/protocol.py' -d /tmp/up/src
    python tests/vectors/server_fields/extract.py /tmp/up/src > \\
        tests/vectors/server_fields/upstream_fields.json

A model's fields are the annotated names of its class body and of its bases' (pydantic
model fields), across every file read: `ClassVar`s and `_private` names are not fields.
Only the request models of the endpoints the gateway serves (chat, completions,
embeddings) are written.
"""

from __future__ import annotations

import ast
import json
import sys
from pathlib import Path

# (server, release, protocol files under the unpacked root, request models written)
SOURCES = (
    (
        "vllm",
        "0.34.0",
        (
            "vllm/entrypoints/serve/engine/protocol.py",
            "vllm/entrypoints/generate/base/protocol.py",
            "vllm/entrypoints/openai/chat_completion/protocol.py",
            "vllm/entrypoints/openai/completion/protocol.py",
            "vllm/entrypoints/pooling/base/protocol.py",
            "vllm/entrypoints/pooling/embed/protocol.py",
        ),
        (
            "ChatCompletionRequest",
            "CompletionRequest",
            "EmbeddingCompletionRequest",
            "EmbeddingChatRequest",
        ),
    ),
    (
        "sglang",
        "0.5.23",
        ("sglang/srt/entrypoints/openai/protocol.py",),
        ("ChatCompletionRequest", "CompletionRequest", "EmbeddingRequest"),
    ),
)


def _classes(paths: list[Path]) -> dict[str, ast.ClassDef]:
    """Every top-level class of the files, by name (a later file's wins)."""
    found: dict[str, ast.ClassDef] = {}
    for path in paths:
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            if isinstance(node, ast.ClassDef):
                found[node.name] = node
    return found


def _own_fields(node: ast.ClassDef) -> set[str]:
    names: set[str] = set()
    for item in node.body:
        if not (isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name)):
            continue
        name = item.target.id
        if name.startswith("_") or "ClassVar" in ast.unparse(item.annotation):
            continue
        names.add(name)
    return names


def _fields(name: str, classes: dict[str, ast.ClassDef]) -> set[str]:
    """The fields of `name` and of each base defined in the files read."""
    node = classes[name]
    names = _own_fields(node)
    for base in node.bases:
        base_name = ast.unparse(base).rpartition(".")[2]
        if base_name in classes and base_name != name:
            names |= _fields(base_name, classes)
    return names


def main(root: Path) -> dict[str, object]:
    out: dict[str, object] = {}
    for server, release, files, models in SOURCES:
        classes = _classes([root / f for f in files])
        out[server] = {
            "release": release,
            "files": list(files),
            "models": {m: sorted(_fields(m, classes)) for m in models},
        }
    return out


if __name__ == "__main__":
    json.dump(main(Path(sys.argv[1])), sys.stdout, indent=1)
    sys.stdout.write("\n")
