#!/usr/bin/env bash
# Install InferenceOS into a virtual environment (default .venv), building llama.cpp.
#
#   scripts/install.sh [EXTRA]      EXTRA: "test" adds the test tools
#
# llama-cpp-python compiles llama.cpp from source: about 5 minutes on 2 cores, once.
# The wheel is kept in a cache folder named after the exact build settings, because
# pip's own wheel cache ignores CMAKE_ARGS and would happily reuse a wheel built
# without the RPC backend (or for another GPU backend).
#
# Environment:
#   INFERENCEOS_VENV   where the virtual environment goes (default: .venv)
#   CMAKE_ARGS         extra llama.cpp build options, e.g. "-DGGML_CUDA=on";
#                      -DGGML_RPC=ON is always added (multi-node needs it)
#   INFERENCEOS_KEEP_AMX=1  keep Intel AMX kernels (see below)
#   LLAMA_CPP_PATCHES  patch files (-p1, against the llama-cpp-python sdist) applied
#                      before the build, space-separated; part of the cache key. The
#                      Vulkan build uses one (scripts/install_vulkan.sh)
set -euo pipefail
cd "$(dirname "$0")/.."

LLAMA_CPP_PYTHON_VERSION=0.3.36
VENV=${INFERENCEOS_VENV:-.venv}
EXTRA=${1:-}
PYTHON=${PYTHON:-python3}

if [ ! -x "$VENV/bin/python" ]; then
    echo "Creating virtual environment in $VENV"
    "$PYTHON" -m venv "$VENV"
fi
PY="$VENV/bin/python"
"$PY" -m pip install --quiet --upgrade pip wheel

# --- llama.cpp (llama-cpp-python), built once per build configuration ---------------
export CMAKE_ARGS="${CMAKE_ARGS:-} -DGGML_RPC=ON"
# Some virtual machines advertise AMX in CPUID but fault on its instructions
# (SIGILL in ggml_backend_amx_mul_mat), and -march=native turns AMX on. AMX only speeds
# up prefill of a few quant types on Xeon 4th gen+, so it is off unless asked for.
if [ "$(uname -m)" = "x86_64" ] && [ -z "${INFERENCEOS_KEEP_AMX:-}" ]; then
    export CFLAGS="${CFLAGS:-} -mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
    export CXXFLAGS="${CXXFLAGS:-} -mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
fi
patches=${LLAMA_CPP_PATCHES:-}
patch_sums=""
for p in $patches; do patch_sums+="|$(sha256sum < "$p" | cut -c1-16)"; done
key=$(printf '%s|%s|%s|%s|%s%s' "$LLAMA_CPP_PYTHON_VERSION" "$CMAKE_ARGS" "${CFLAGS:-}" \
      "$("$PY" -c 'import sys; print(sys.version_info[:2])')" "$(uname -m)" "$patch_sums" \
      | sha256sum | cut -c1-16)
wheel_dir="${XDG_CACHE_HOME:-$HOME/.cache}/inferenceos/wheels/$key"
installed_key_file="$VENV/.llama-build-key"
if [ "$(cat "$installed_key_file" 2>/dev/null)" != "$key" ]; then
    if ! ls "$wheel_dir"/llama_cpp_python-*.whl >/dev/null 2>&1; then
        echo "Building llama.cpp (llama-cpp-python $LLAMA_CPP_PYTHON_VERSION, CMAKE_ARGS='$CMAKE_ARGS')."
        echo "This compiles C++ for about 5 minutes on 2 cores; it happens once."
        mkdir -p "$wheel_dir"
        build_start=$(date +%s)
        if [ -z "$patches" ]; then
            "$PY" -m pip wheel --quiet --no-deps --no-cache-dir \
                "llama-cpp-python==$LLAMA_CPP_PYTHON_VERSION" -w "$wheel_dir"
        else
            # the sdist, patched, built in folders kept until the wheel exists: a build
            # that stopped (a compile error, a killed CI job) resumes where it was
            src="$wheel_dir/src/llama_cpp_python-$LLAMA_CPP_PYTHON_VERSION"
            if [ ! -f "$wheel_dir/src/.patched" ]; then
                rm -rf "$wheel_dir/src" && mkdir -p "$wheel_dir/src"
                "$PY" -m pip download --quiet --no-deps --no-binary :all: \
                    "llama-cpp-python==$LLAMA_CPP_PYTHON_VERSION" -d "$wheel_dir/src"
                tar xzf "$wheel_dir/src/llama_cpp_python-$LLAMA_CPP_PYTHON_VERSION.tar.gz" \
                    -C "$wheel_dir/src"
                for p in $patches; do
                    echo "Applying $p"
                    patch --quiet -p1 -d "$src" < "$p"
                done
                touch "$wheel_dir/src/.patched"
            fi
            "$PY" -m pip wheel --quiet --no-deps --no-cache-dir \
                --config-settings=build-dir="$wheel_dir/build" "$src" -w "$wheel_dir"
            rm -rf "$wheel_dir/src" "$wheel_dir/build"
        fi
        build_s=$(( $(date +%s) - build_start ))
        echo "$build_s" > "$wheel_dir/build_seconds"  # kept beside the wheel, for reports
        echo "llama.cpp built in $build_s s"
    fi
    "$PY" -m pip install --quiet --force-reinstall --no-deps "$wheel_dir"/llama_cpp_python-*.whl
    echo "$key" > "$installed_key_file"
fi

# --- InferenceOS itself ----------------------------------------------------------------
target="."
[ -n "$EXTRA" ] && target=".[$EXTRA]"
"$PY" -m pip install --quiet -e "$target"
# An editable install leaves src/ without bytecode, and where PYTHONDONTWRITEBYTECODE is
# set (this image sets it) every command would compile ~150 modules again: 0.3-0.4 s
# of each `inferenceos` start. Compiled once here; Python still reads .pyc files then.
"$PY" -m compileall -q src

"$PY" - <<'EOF'
import pathlib, sys
import llama_cpp
lib = pathlib.Path(llama_cpp.__file__).parent / "lib"
if not any(lib.glob("libggml-rpc*")):
    sys.exit("llama.cpp was built without its RPC backend; remove the wheel cache and rerun")
EOF
# --- what the test suite drives as a person would: a terminal (tmux) and a browser --------
# (chat and monitor run under tmux; the web dashboard is checked in headless Chromium).
# Installed with the system's package manager when we are root and they are missing.
if [ "$EXTRA" = "test" ]; then
    missing=()
    command -v tmux >/dev/null 2>&1 || missing+=(tmux)
    command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 \
        || missing+=(chromium)
    if [ "${#missing[@]}" -gt 0 ]; then
        if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
            echo "Installing test tools: ${missing[*]}"
            apt-get update -qq >/dev/null && \
                DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null \
                || echo "warning: could not install ${missing[*]}; the tests that need them skip"
        else
            echo "note: ${missing[*]} not installed; the tests that need them skip"
        fi
    fi
fi
echo "InferenceOS installed in $VENV"
