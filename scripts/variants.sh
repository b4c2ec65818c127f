#!/usr/bin/env bash
# Stage pagekernels variants for an A/B on the lent GPU (scripts/gpu-ab.sh runs them there).
#
#   scripts/variants.sh main wip/softmax-turn-serial b3c32ee
#
# For each git ref, writes that commit's packages/pagekernels to ab/<name>/pagekernels (name: the
# ref with '/' turned into '-') and lists the names in ab/variants.txt, in the order given. ab/ is
# untracked but not ignored, so the device's copy of the tree carries it; the device has no git
# history to check refs out from. Delete ab/ before committing. Only pagekernels varies: the
# other packages come from the working tree.
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -ge 2 ] || { echo "usage: scripts/variants.sh REF REF [REF ...] (two or more)" >&2; exit 2; }
rm -rf ab/*/pagekernels ab/variants.txt
mkdir -p ab
for ref in "$@"; do
  name=${ref//\//-}
  sha=$(git rev-parse --short "$ref^{commit}")
  rm -rf "ab/$name"
  mkdir -p "ab/$name"
  git archive "$sha" packages/pagekernels | tar -x -C "ab/$name" --strip-components=1
  # The device call carries at most 64 MiB in all; a wheel needs no tests.
  rm -rf "ab/$name/pagekernels/tests"
  echo "$sha" >"ab/$name/commit"
  echo "$name" >>ab/variants.txt
  echo "ab/$name: $ref ($sha)"
done
