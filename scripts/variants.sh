#!/usr/bin/env bash
# Stage pagekernels variants for an A/B on the lent GPU (scripts/gpu-ab.sh runs them there).
#
#   scripts/variants.sh main wip/softmax-turn-serial b3c32ee
#
# For each git ref, writes under ab/<name>/ (name: the ref with '/' turned into '-') what turns
# the working tree's packages/pagekernels into that commit's: overlay.tar (the files that differ,
# as the commit has them) and removed.txt (the files it lacks), and lists the names in
# ab/variants.txt, in the order given. gpu-ab.sh assembles each variant on the device from the
# tree's copy: a device call carries at most 64 MiB, too little for whole copies beside MLX's
# wheel. ab/base.sha256 records the tracked files the overlays were made against; gpu-ab.sh
# refuses a tree that has changed since. Untracked files under packages/pagekernels go into
# every variant, and the tests always come from the tree. ab/ is untracked but not ignored, so
# the device's copy of the tree carries it; the device has no git history to check refs out
# from. Delete ab/ before committing. Only pagekernels varies: the other packages come from the
# working tree.
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -ge 2 ] || { echo "usage: scripts/variants.sh REF REF [REF ...] (two or more)" >&2; exit 2; }
rm -rf ab/*/pagekernels ab/*/overlay.tar ab/*/removed.txt ab/variants.txt ab/base.sha256
mkdir -p ab
git ls-files -z packages/pagekernels | xargs -0 sha256sum >ab/base.sha256
for ref in "$@"; do
  name=${ref//\//-}
  sha=$(git rev-parse --short "$ref^{commit}")
  rm -rf "ab/$name"
  mkdir -p "ab/$name"
  differing=$(git diff -z --name-only --no-renames "$sha" -- packages/pagekernels | tr '\0' '\n')
  changed=()
  : >"ab/$name/removed.txt"
  while IFS= read -r f; do
    [ -n "$f" ] || continue
    if git cat-file -e "$sha:$f" 2>/dev/null; then changed+=("$f"); else echo "$f" >>"ab/$name/removed.txt"; fi
  done <<<"$differing"
  if [ ${#changed[@]} -gt 0 ]; then
    git --literal-pathspecs archive -o "ab/$name/overlay.tar" "$sha" -- "${changed[@]}"
  fi
  echo "$sha" >"ab/$name/commit"
  echo "$name" >>ab/variants.txt
  echo "ab/$name: $ref ($sha), ${#changed[@]} files differ, $(wc -l <"ab/$name/removed.txt") removed"
done
