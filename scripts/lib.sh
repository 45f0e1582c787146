# What the shell scripts share, sourced by them from the repository's root: root rights, Debian
# packages, and a benchmark's scratch directory with the mounts in it, cleaned up however the
# script ends. The benchmark functions read the caller's $runs (how many runs), $bin (the shardfs
# binary), `systems` (the systems compared, the baseline first), `dir` (each one's mount point or
# directory) and its `serve SYSTEM` (mounts it).

as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }

# apt_install PKG...: installs the Debian packages (updating the package lists first if that fails).
apt_install() {
  echo "installing $* with apt-get" >&2
  DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -qq "$@" >/dev/null ||
    { as_root apt-get update -qq && DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -qq "$@" >/dev/null; }
}

# need_tools PKG:TOOL...: installs each package whose tool is not on PATH.
need_tools() {
  local pair missing=()
  for pair in "$@"; do command -v "${pair#*:}" >/dev/null || missing+=("${pair%%:*}"); done
  if [ ${#missing[@]} -gt 0 ]; then apt_install "${missing[@]}"; fi
}

drop_caches() { sync; as_root sh -c "echo 3 >/proc/sys/vm/drop_caches"; }

# scratch NAME: a fresh directory in $work for a benchmark's files and mounts; on exit every mount
# made with mkmnt (or added to $mounts) is unmounted, and the directory removed unless a mount
# is still there (never delete through one).
scratch() {
  work=$(mktemp -d -t "shardfs-$1.XXXXXX")
  mounts=()
  trap 'unmount_all' EXIT
}
unmount_all() {
  local m
  for m in "${mounts[@]}"; do
    if mountpoint -q "$m"; then fusermount3 -u "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || true; fi
  done
  if grep -q " $work/" /proc/mounts; then echo "mounts left under $work, not removing it" >&2; else rm -rf "$work"; fi
}
# mkmnt NAME: a fresh mount point in $m, remembered for cleanup (no subshell, so the list sticks).
mkmnt() { m=$work/$1; mkdir -p "$m"; mounts+=("$m"); }

# hyperfine_json JSON ARGS...: hyperfine's medians of ARGS into JSON (without a shell where it can).
hyperfine_json() {
  local json=$1
  shift
  hyperfine -N --style none --warmup 1 --runs "$runs" --export-json "$json" "$@" >/dev/null 2>&1 ||
    hyperfine --style none --warmup 1 --runs "$runs" --export-json "$json" "$@" >/dev/null
}

# unserve SYSTEM: unmounts what the benchmark's serve mounted at ${dir[SYSTEM]} (plain files:
# nothing; shardfs with `shardfs unmount`, which waits for its daemon).
unserve() {
  case $1 in
    plain) ;;
    shardfs*) "$bin" unmount "${dir[$1]}" ;;
    *) fusermount3 -u "${dir[$1]}" ;;
  esac
}

# cold_cat_row TITLE SUBPATH: a markdown row of `cat` of every file below each system's
# ${dir[SYSTEM]}/SUBPATH, each of $runs runs on a fresh mount (the caller's unserve and serve) with
# the kernel's caches dropped, the median against the first system's. hyperfine cannot remount
# between runs of one command, so this loop keeps its rules.
cold_cat_row() {
  local title=$1 sub=$2 s run start end times cells=()
  for s in "${systems[@]}"; do
    times=()
    for ((run = 0; run < runs; run++)); do
      unserve "$s"; drop_caches; serve "$s"
      start=$(date +%s%N); find "${dir[$s]}$sub" -type f -print0 | xargs -0 cat >/dev/null; end=$(date +%s%N)
      times+=("$(((end - start) / 1000))")
    done
    cells+=("$(printf '%s\n' "${times[@]}" | sort -n | sed -n "$(((runs + 1) / 2))p")")
  done
  python3 - "$title" "${cells[@]}" <<'PY'
import sys
title, us = sys.argv[1], [int(x) for x in sys.argv[2:]]
print(f"| {title} | " + " | ".join(f"{u/1000:.1f} ms ({u/us[0]:.2f}x)" for u in us) + " |")
PY
}
