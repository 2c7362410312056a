#!/usr/bin/env bash
# Restore the real-trace corpus listed in bench/traces/SOURCES-*.md from git mirrors or clones.
#
#   bench/traces/restore.sh MIRRORS OUT [SOURCES.md ...]
#
# MIRRORS holds one git directory (bare or not) per repository, found as MIRRORS/owner+name/repo
# (the `fetch` tool's layout), MIRRORS/owner+name, MIRRORS/owner/name or MIRRORS/name. Each table
# row's blob COMMIT:PATH is written to OUT/<local name> and kept only if its md5 matches; tables
# without a `local name`/`file` column get OWNER__PATH-WITH-_-FOR-/__COMMIT8. The md5-checked
# files' absolute paths go to OUT/restored.txt; every row not restored is printed with the reason,
# and the exit status is 1 when any was. With TR=DIR set, DIR/{nhf,nhfull,kk512full,kk256f}.pickle,
# DIR/kl_memory_ctx128_forward.pickle, DIR/niu/*.pickle and DIR/hyp/*.pickle (the names the
# results quote) are made as symlinks into OUT.
set -u
[ $# -ge 2 ] || { sed -n 4,13p "$0"; exit 2; }
mirrors=$1 out=$2
shift 2
[ $# -gt 0 ] || set -- "$(dirname "$0")"/SOURCES-*.md
mkdir -p "$out" && out=$(cd "$out" && pwd) || exit 2
: >"$out/restored.txt"

# Print "name|repo|commit|path|md5" for every data row of the tables in $1,
# taking the columns by their header names (the files order them differently; '|' and not a tab
# separates them, as read would merge an empty name's tab with the next).
rows() {
  awk -F'|' '
    function trim(s) { gsub(/^ +| +$/, "", s); return s }
    /^\|/ && /repository/ && /commit/ {
      for (i = 2; i < NF; i++) col[trim($i)] = i
      name = ("local name" in col) ? col["local name"] : (("file" in col) ? col["file"] : 0)
      intable = 1; next
    }
    !/^\|/ { intable = 0; delete col; next }
    intable && !/^\|[-| ]*$/ {
      printf "%s|%s|%s|%s|%s\n", name ? trim($name) : "", trim($col["repository"]),
        trim($col["commit"]), trim($col["path"]), trim($col["md5"])
    }' "$1"
}

gitdir() {
  local d
  for d in "$mirrors/${1/\//+}/repo" "$mirrors/${1/\//+}" "$mirrors/$1" "$mirrors/${1#*/}"; do
    git -C "$d" rev-parse --git-dir >/dev/null 2>&1 && { echo "$d"; return; }
  done
  return 1
}

ok=0 bad=0
skip() { echo "not restored: $1 ($2)"; bad=$((bad + 1)); }
for table in "$@"; do
  while IFS='|' read -r name repo commit path md5; do
    [[ $repo == */* ]] || { skip "${name:-$path} in $table" "repository '$repo'"; continue; }
    [ -n "$name" ] || { name=${path//\//_}; name="${repo%%/*}__${name}__${commit:0:8}"; }
    dir=$(gitdir "$repo") || { skip "$name" "no mirror of $repo"; continue; }
    if ! git -C "$dir" cat-file -e "$commit:$path" 2>/dev/null ||
      ! git -C "$dir" show "$commit:$path" >"$out/$name" 2>/dev/null; then
      rm -f "$out/$name"; skip "$name" "blob $repo $commit:$path absent"; continue
    fi
    got=$(md5sum <"$out/$name" | cut -c1-32)
    if [ "$got" != "$md5" ]; then
      why="md5 $got, want $md5"
      head -c 40 "$out/$name" | grep -q '^version https://git-lfs' && why="a Git LFS pointer"
      rm -f "$out/$name"; skip "$name" "$why"; continue
    fi
    echo "$out/$name" >>"$out/restored.txt"; ok=$((ok + 1))
  done < <(rows "$table")
done
sort -u -o "$out/restored.txt" "$out/restored.txt"
echo "restored $ok rows ($(wc -l <"$out/restored.txt") distinct files) into $out; $bad rows not"

if [ -n "${TR:-}" ]; then
  mkdir -p "$TR/niu"
  link() { if [ -f "$out/$1" ]; then ln -sf "$out/$1" "$TR/$2"; else echo "no $out/$1 for $TR/$2"; fi; }
  link nothanmin__memory_snapshot_forward.pickle__bbd29721 nhf.pickle
  link nothanmin__memory_snapshot.pickle__33be88e6 nhfull.pickle
  link kkaitlyn__memory_ctx512_fullstep_.pickle kk512full.pickle
  link kkaitlyn__memory_ctx256_forward_.pickle kk256f.pickle
  link kkaitlyn__cs336_systems_memory_logs_memory_ctx128_forward.pickle__c1272e18 \
    kl_memory_ctx128_forward.pickle
  mkdir -p "$TR/hyp"
  for f in "$out"/niu__cs336_systems_profile_memory_*__9d868b9b "$out"/hyperion__*__ee486a41; do
    b=${f##*/niu__cs336_systems_profile_memory_} dir=niu
    [[ $f == */hyperion__* ]] && b=${f##*/hyperion__} dir=hyp
    link "${f##*/}" "$dir/${b%__*}"
  done
fi
[ "$bad" -eq 0 ]
