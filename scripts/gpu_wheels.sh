#!/usr/bin/env bash
# Collect everything scripts/gpu_check.sh needs on the GPU machine, which has Python 3.12,
# CUDA, CMake and ninja but no package registry, into one carried folder (default .gpu/,
# git-ignored through .git/info/exclude; under the 64 MiB a call may carry):
#
#   .gpu/wheels/*.whl                 our package and the dependencies that machine lacks
#                                     or has in other versions (cp312 manylinux wheels)
#   .gpu/llama_cpp_python-VER-src.tar.gz  the llama-cpp-python sdist, trimmed of what a
#                                     CUDA build never reads (docs, media, vocab test
#                                     models, other GPU backends): ~20 MB instead of 77
#
# Run here (it uses pip's ordinary client against PyPI), then on the GPU machine:
#   run(command="bash scripts/gpu_check.sh", carry=[".gpu"], timeout_s=600)
# The machine already has numpy, jinja2, pyyaml, tqdm, huggingface_hub, matplotlib,
# nvidia-ml-py, scikit-build-core's needs, cmake and ninja (the device notes' package
# list); the built-in Gemma package (250 MB) is not carried: gpu_check writes a synthetic
# model there instead.
set -euo pipefail
cd "$(dirname "$0")/.."
DEST=${1:-.gpu}
PY=${PYTHON:-.venv/bin/python}
LLAMA_VER=0.3.36
mkdir -p "$DEST/wheels"
for ignored in /.gpu/ /.gpu-build/ /gpu-out/; do
    grep -qx "$ignored" .git/info/exclude 2>/dev/null || echo "$ignored" >> .git/info/exclude
done
rm -f "$DEST"/wheels/*.whl

# the versions this checkout is tested with (the venv's), one of each
pins=()
for name in fastapi starlette pydantic pydantic-core annotated-types typing-inspection \
            annotated-doc uvicorn platformdirs diskcache gguf typer click rich shellingham \
            markdown-it-py mdurl anyio sniffio h11 typing-extensions scikit-build-core \
            pathspec packaging opentelemetry-api; do
    v=$("$PY" -m pip show "$name" 2>/dev/null | awk '/^Version:/{print $2}' || true)
    if [ -n "$v" ]; then pins+=("$name==$v"); else pins+=("$name"); fi
done
"$PY" -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 -d "$DEST/wheels" "${pins[@]}"
"$PY" -m pip wheel --quiet --no-deps -w "$DEST/wheels" .

# llama-cpp-python's source, trimmed
src_cache="${XDG_CACHE_HOME:-$HOME/.cache}/inferenceos/llama-tools/$LLAMA_VER"
tarball="$src_cache/llama_cpp_python-$LLAMA_VER.tar.gz"
if [ ! -f "$tarball" ]; then
    mkdir -p "$src_cache"
    "$PY" -m pip download --quiet --no-deps --no-binary :all: \
        "llama-cpp-python==$LLAMA_VER" -d "$src_cache"
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
tar -xzf "$tarball" -C "$work"
v="$work/llama_cpp_python-$LLAMA_VER/vendor/llama.cpp"
rm -rf "$work/llama_cpp_python-$LLAMA_VER/.git" "$v/.git"  # git history: build info says "unknown"
rm -rf "$v/docs" "$v/media" "$v/benches" "$v/models/"*.gguf "$v/models/"*.gguf.* \
       "$v/tools/server/public" "$v/.devops" "$v/examples" "$v/tests"/*.gguf
for b in sycl vulkan opencl hexagon metal cann musa kompute zdnn webgpu et openvino virtgpu; do
    rm -rf "$v/ggml/src/ggml-$b"
done
# CMake still names examples/ and tests/ subdirectories behind options that are off;
# keep empty stand-ins so a configure with them off never looks inside
mkdir -p "$v/examples" && : > "$v/examples/CMakeLists.txt"
tar -czf "$DEST/llama_cpp_python-$LLAMA_VER-src.tar.gz" -C "$work" "llama_cpp_python-$LLAMA_VER"
du -sh "$DEST" "$DEST"/wheels "$DEST"/*.tar.gz
echo "carry [\"$DEST\"] with: bash scripts/gpu_check.sh"
