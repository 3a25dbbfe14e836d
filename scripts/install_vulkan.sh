#!/usr/bin/env bash
# Install InferenceOS into .venv-vulkan with llama.cpp built for its Vulkan backend.
#
#   scripts/install_vulkan.sh [EXTRA]      EXTRA: "test" adds the test tools
#
# On a machine with no GPU, Vulkan runs on Mesa's lavapipe (llvmpipe): a conformant
# Vulkan 1.3 device computed by the CPU. To llama.cpp it is a GPU, with its own buffers
# and its own memory figure (docs/gpu.md, "Vulkan on lavapipe"). On a machine with a real
# Vulkan GPU the same build uses that GPU.
#
# The Debian packages the build needs (the Vulkan loader and headers, the shader
# compiler glslc, SPIR-V headers, lavapipe itself and vulkaninfo) are installed here with
# apt-get when they are missing and we are root. The llama.cpp build itself is
# scripts/install.sh's, with CMAKE_ARGS="-DGGML_VULKAN=on": the wheel goes into the
# same keyed cache (~/.cache/inferenceos/wheels/<key>), under its own key.
# A first build compiles llama.cpp and its ~150 Vulkan shaders: 20-40 minutes on 2 cores.
#
# Environment:
#   INFERENCEOS_VULKAN_VENV  where the virtual environment goes (default: .venv-vulkan)
set -euo pipefail
cd "$(dirname "$0")/.."

VENV=${INFERENCEOS_VULKAN_VENV:-.venv-vulkan}
PACKAGES=(mesa-vulkan-drivers libvulkan-dev glslc spirv-headers vulkan-tools)

missing=()
for pkg in "${PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" \
        || missing+=("$pkg")
done
if [ "${#missing[@]}" -gt 0 ]; then
    if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
        echo "Installing the Vulkan build packages: ${missing[*]}"
        apt-get update -qq >/dev/null
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
    elif command -v glslc >/dev/null 2>&1 && [ -e /usr/include/vulkan/vulkan.h ]; then
        echo "note: not root; using the Vulkan headers and glslc already here"
    else
        echo "error: the Vulkan build needs ${missing[*]}; run this as root or install them" >&2
        exit 1
    fi
fi

# The vendored llama.cpp (0c1e57098) builds its Vulkan instance with
# VK_EXT_layer_settings (only to configure the validation layer), which Vulkan headers
# have had since 1.3.272; Debian 12's libvulkan-dev is 1.3.239, and the build stopped at
# "'LayerSettingEXT' is not a member of 'vk'". The patch compiles that block only where
# the headers define the extension; everything else builds as is.
patches=""
if ! grep -q "VK_EXT_layer_settings" /usr/include/vulkan/vulkan_core.h 2>/dev/null; then
    patches="scripts/patches/ggml-vulkan-headers-1.3.239.patch"
fi
start=$(date +%s)
INFERENCEOS_VENV="$VENV" CMAKE_ARGS="${CMAKE_ARGS:-} -DGGML_VULKAN=on" \
    LLAMA_CPP_PATCHES="$patches" ./scripts/install.sh "$@"

"$VENV/bin/python" - <<'PY'
import pathlib, sys
import llama_cpp
lib = pathlib.Path(llama_cpp.__file__).parent / "lib"
if not any(lib.glob("libggml-vulkan*")):
    sys.exit("llama.cpp was built without its Vulkan backend; remove the wheel cache and rerun")
PY
echo "Vulkan build ready in $VENV ($(( $(date +%s) - start )) s)"
