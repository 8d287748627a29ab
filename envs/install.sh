#!/usr/bin/env bash
# Creates the pipeline's environment in .venv (or $MOE_BENCH_VENV) with the exact pins of
# envs/requirements.txt. llama-cpp-python is built with its CMake option LLAMA_BUILD=OFF:
# it then ships no libllama of its own and loads the pipeline's patched build through
# LLAMA_CPP_LIB_PATH (harness.build.bindings sets it). Its default install would compile an unpatched
# llama.cpp for many minutes.
set -euo pipefail
cd "$(dirname "$0")/.."
venv="${MOE_BENCH_VENV:-.venv}"
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
pins=envs/requirements.txt
grep -v '^llama-cpp-python==' "$pins" > "$venv/pins-without-llama.txt"
"$venv/bin/pip" install --quiet --disable-pip-version-check -r "$venv/pins-without-llama.txt"
# --no-cache-dir: never reuse a wheel that some earlier install built with LLAMA_BUILD on.
CMAKE_ARGS="-DLLAMA_BUILD=OFF" "$venv/bin/pip" install --quiet --disable-pip-version-check \
    --no-cache-dir --no-deps "$(grep '^llama-cpp-python==' "$pins")"
"$venv/bin/pip" install --quiet --disable-pip-version-check --no-deps -e .
echo "environment ready in $venv"
