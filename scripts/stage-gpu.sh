#!/usr/bin/env bash
# Re-lay MLX's CUDA wheel for the lent GPU in three parts instead of the two of
# ../shared/device/stage-mlx-cuda.sh (run that first: it makes .gpu-a/ and .gpu-b/). A device
# call carries at most 64 MiB, the working tree included; with halves of 45 MB each, a tree past
# 20 MB no longer fits beside one. Thirds leave room for the tree to grow.
#
# Writes the ignored folders .gpu-1/ .gpu-2/ .gpu-3/, each with a part; .gpu-3/ also has the small
# wheels and install.sh. The device calls, back to back (the machine goes back ~30 s after a call):
#   1. carry [".gpu-1", ".whl"]  bash .gpu-1/stash.sh     (.whl, ignored, stays on the machine)
#   2. carry [".gpu-2"]          bash .gpu-2/stash.sh
#   3. carry [".gpu-3"]          bash .gpu-3/install.sh && <the job, or nothing>
# Later calls while the machine is warm need no carry: MLX stays installed in its python3.
set -euo pipefail
cd "$(dirname "$0")/.."
for f in .gpu-a/part.00 .gpu-b/part.01 .gpu-b/big-wheel-name; do
  [ -f "$f" ] || { echo "no $f: run bash ../shared/device/stage-mlx-cuda.sh first" >&2; exit 2; }
done
name=$(cat .gpu-b/big-wheel-name)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cat .gpu-a/part.00 .gpu-b/part.01 >"$work/$name"
rm -rf .gpu-1 .gpu-2 .gpu-3
mkdir -p .gpu-1 .gpu-2 .gpu-3
split -n 3 -d "$work/$name" "$work/part."
exclude=$(git rev-parse --git-path info/exclude)  # also right in a worktree
mkdir -p "$(dirname "$exclude")"
for i in 1 2 3; do
  mv "$work/part.0$((i - 1))" ".gpu-$i/"
  grep -qxF "/.gpu-$i/" "$exclude" 2>/dev/null || echo "/.gpu-$i/" >>"$exclude"
done
echo "$name" >.gpu-3/big-wheel-name
(cd "$work" && sha256sum "$name") >.gpu-3/big-wheel.sha256
cp -r .gpu-b/wheels .gpu-3/wheels
for i in 1 2; do
  cat >".gpu-$i/stash.sh" <<'EOS'
#!/usr/bin/env bash
# Park this folder's part of MLX's CUDA wheel outside the tree (scripts/stage-gpu.sh).
set -e
mkdir -p /root/gpu-stage
cp "$(dirname "$0")"/part.* /root/gpu-stage/
echo "parked $(ls /root/gpu-stage)"
EOS
done
cat >.gpu-3/install.sh <<'EOS'
#!/usr/bin/env bash
# Join the three parts of MLX's CUDA wheel and install MLX into python3 (scripts/stage-gpu.sh).
set -e
if python3 -c "import mlx.core as mx, sys; sys.exit(not mx.cuda.is_available())" 2>/dev/null; then
  echo "mlx (cuda) already installed"; exit 0
fi
for p in part.00 part.01; do
  [ -f "/root/gpu-stage/$p" ] ||
    { echo "PART $p MISSING: a fresh machine; make calls 1 and 2 first" >&2; exit 3; }
done
here=$(cd "$(dirname "$0")" && pwd)
name=$(cat "$here/big-wheel-name")
cat /root/gpu-stage/part.00 /root/gpu-stage/part.01 "$here/part.02" >"/root/gpu-stage/$name"
(cd /root/gpu-stage && sha256sum --quiet -c "$here/big-wheel.sha256") ||
  { echo "the joined wheel is not MLX's (stale parts?): make calls 1 and 2 again" >&2; exit 3; }
python3 -m pip install -q --no-index --no-deps --no-cache-dir "/root/gpu-stage/$name" "$here"/wheels/*.whl
python3 -c "import mlx.core as mx; print('mlx', mx.__version__, mx.default_device(), 'cuda', mx.cuda.is_available())"
EOS
chmod +x .gpu-1/stash.sh .gpu-2/stash.sh .gpu-3/install.sh
cat .gpu-1/part.00 .gpu-2/part.01 .gpu-3/part.02 | cmp - "$work/$name" ||
  { echo "the parts do not join into $name" >&2; exit 1; }
echo "parts check out"
du -sh .gpu-1 .gpu-2 .gpu-3
