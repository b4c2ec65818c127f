#!/usr/bin/env bash
# Download the wheels the GPU machine lacks (it has no registry) into .whl/ (git-ignored).
# MLX's CUDA build itself is staged by ../shared/device/stage-mlx-cuda.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
grep -qxF /.whl/ .git/info/exclude 2>/dev/null || echo /.whl/ >> .git/info/exclude
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
  --implementation cp --platform manylinux_2_28_x86_64 -d .whl \
  structlog==26.1.0 nanobind==3.1.0 scikit_build_core==1.1.2 mlx-lm==0.32.2
ls -la .whl
