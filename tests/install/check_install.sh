#!/usr/bin/env bash
# Proves that an installed dltrain stands alone: installs BUILD_DIR into a scratch prefix,
# moves the prefix elsewhere, makes the build tree and the checkout's private dependencies
# (.deps: PyPI's oneDNN from scripts/setup.sh) unreachable, then builds tests/install/ against
# the moved prefix through CMake and through pkg-config, runs both, and runs every installed
# program. No installed file may name the checkout, the build tree or the prefix it was
# installed to; the prefix's own libraries (libdltrain.so, the bundled libdnnl.so.3) must be
# found through RUNPATHs relative to $ORIGIN.
#
#   tests/install/check_install.sh BUILD_DIR WORK_DIR
#
# Leaves the moved prefix in WORK_DIR/elsewhere/dltrain (printed last) for further checks.
# BUILD_DIR and ROOT/.deps are renamed to NAME.hidden-by-check-install while the consumers are
# built and run, and renamed back on exit, also on failure or Ctrl-C (a run killed with
# SIGKILL leaves them renamed: the next run renames them back first).
# Every check runs; the exit status is 1 if any failed. Environment: JOBS (2).
set -uo pipefail
if [[ $# -ne 2 ]]; then
  echo "usage: $0 BUILD_DIR WORK_DIR" >&2
  exit 2
fi
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
build=$(cd "$1" && pwd) || exit 2
mkdir -p "$2" && work=$(cd "$2" && pwd) || exit 2
jobs=${JOBS:-2}
staging=$work/staging/usr
moved=$work/elsewhere/dltrain
failed=0
say() { echo "check_install: $*"; }
bad() {
  echo "check_install: FAIL: $*" >&2
  failed=1
}
# run NAME CMD...: runs a step, its output on failure only.
run() {
  local name=$1 log
  shift
  log=$("$@" 2>&1) && return 0
  echo "$log" | tail -40 >&2
  bad "$name"
  return 1
}

# --- hide / restore --------------------------------------------------------------------
suffix=.hidden-by-check-install
hidden=()
restore() {
  local p
  for p in "${hidden[@]}"; do
    mv "$p$suffix" "$p" || echo "check_install: could not rename $p$suffix back to $p" >&2
  done
  hidden=()
}
trap restore EXIT
trap 'exit 130' INT TERM HUP
hide() {
  local p=$1
  if [[ -e $p$suffix ]]; then  # left by a run that was killed
    if [[ -e $p ]]; then
      echo "check_install: both $p and $p$suffix exist; remove one" >&2
      exit 2
    fi
    mv "$p$suffix" "$p"
  fi
  [[ -e $p ]] || return 0
  mv "$p" "$p$suffix" && hidden+=("$p")
}
for p in "$build" "$root/.deps"; do  # recover from a killed run before installing
  if [[ -e $p$suffix && ! -e $p ]]; then mv "$p$suffix" "$p"; fi
done

# --- install, then move ------------------------------------------------------------------
rm -rf "$work/staging" "$work/elsewhere" "$work/consumer" "$work/src"
cmake --install "$build" --prefix "$staging" > /dev/null || {
  bad "cmake --install $build"
  exit 1
}
mkdir -p "$(dirname "$moved")"
mv "$staging" "$moved" && rmdir "$work/staging"
say "installed $build into $staging, moved to $moved"

# --- nothing installed names the checkout, the build tree or the install prefix ------------
for p in "$root" "$build" "$staging"; do
  if files=$(grep -rlF -- "$p" "$moved"); then
    bad "installed files name $p:"$'\n'"$files"
  fi
done

# --- ELF files: RUNPATH; the prefix's own libraries through $ORIGIN ----------------------
is_elf() { [[ -f $1 && ! -L $1 && $(head -c 4 "$1" | od -An -c | tr -d ' ') == '177ELF' ]]; }
elves=()
while IFS= read -r -d '' f; do
  if is_elf "$f"; then elves+=("$f"); fi
done < <(find "$moved" -type f -print0 | sort -z)
libdir=$(dirname "$(find "$moved" -name dltrain.pc | head -1)")
libdir=$(dirname "$libdir")  # .../lib/pkgconfig -> .../lib
own_libs() {  # the NEEDED libraries of $1 that the prefix itself installs
  local n
  for n in $(readelf -d "$1" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p'); do
    if [[ -e $libdir/$n ]]; then echo "$n"; fi
  done
}
check_own_runpath() {  # FILE: each of its own libraries through an $ORIGIN run path
  local f=$1 runpath
  runpath=$(readelf -d "$f" | sed -n 's/.*(\(RUNPATH\|RPATH\)).*\[\(.*\)\]/\2/p')
  # shellcheck disable=SC2016  # a literal $ORIGIN
  if [[ -n $(own_libs "$f") && $runpath != *'$ORIGIN'* ]]; then
    bad "${f#"$moved"/} needs $(own_libs "$f" | tr '\n' ' ')but its run path is '$runpath'"
  fi
  say "  ${f#"$moved"/}: RUNPATH '${runpath}'"
}
say "installed ELF files:"
for f in "${elves[@]}"; do check_own_runpath "$f"; done
# check_loads FILE [LD_LIBRARY_PATH]: every library found, the prefix's own from the prefix.
check_loads() {
  local f=$1 out n
  out=$(env -u LD_LIBRARY_PATH ${2:+LD_LIBRARY_PATH=$2} ldd "$f" 2>&1)
  if grep -q 'not found' <<< "$out"; then
    bad "${f#"$work"/}: libraries not found:"$'\n'"$(grep 'not found' <<< "$out")"
  fi
  for n in $(own_libs "$f"); do
    if ! grep -qF "$n => $libdir/" <<< "$out"; then
      bad "${f#"$work"/} does not load $n from $libdir:"$'\n'"$(grep -F "$n" <<< "$out")"
    fi
  done
}

# --- the checkout's build tree and private dependencies out of reach ----------------------
hide "$build"
hide "$root/.deps"
say "hidden while the consumers build and run: ${hidden[*]:-nothing}"

for f in "${elves[@]}"; do check_loads "$f"; done
for f in "${elves[@]}"; do
  if [[ $f == "$moved"/bin/* ]]; then
    run "${f#"$moved"/} --help" "$f" --help && say "ran ${f#"$moved"/} --help"
  fi
done

# The consumer project, copied out of the checkout, through find_package(dltrain).
mkdir -p "$work/src" && cp "$here/CMakeLists.txt" "$here/main.cpp" "$work/src/"
if run "configure the CMake consumer against $moved" \
  env -u LD_LIBRARY_PATH cmake -S "$work/src" -B "$work/consumer/cmake" -DCMAKE_BUILD_TYPE=Release \
  "-DCMAKE_PREFIX_PATH=$moved${CMAKE_PREFIX_PATH:+;$CMAKE_PREFIX_PATH}" &&
  run "build the CMake consumer" cmake --build "$work/consumer/cmake" -j "$jobs"; then
  check_loads "$work/consumer/cmake/consumer"
  run "run the CMake consumer" env -u LD_LIBRARY_PATH "$work/consumer/cmake/consumer" &&
    say "ran the CMake consumer"
fi

# The same through dltrain.pc alone; at run time LD_LIBRARY_PATH names the prefix's lib
# directory (what a module sets), no other.
pc() { PKG_CONFIG_PATH="$libdir/pkgconfig" pkg-config "$@"; }
pc_libdir=$(pc --variable=libdir dltrain)
if [[ $(cd "$pc_libdir" 2> /dev/null && pwd) != "$libdir" ]]; then
  bad "dltrain.pc's libdir is '$pc_libdir', not $libdir"
fi
# shellcheck disable=SC2046
if run "build the pkg-config consumer" c++ -O1 -o "$work/consumer/consumer_pc" "$work/src/main.cpp" \
  $(pc --cflags --libs dltrain); then
  check_loads "$work/consumer/consumer_pc" "$libdir"
  run "run the pkg-config consumer" env LD_LIBRARY_PATH="$libdir" "$work/consumer/consumer_pc" &&
    say "ran the pkg-config consumer"
fi

restore
if [[ $failed != 0 ]]; then
  say "the installed package in $moved does not stand alone (failures above)"
  exit 1
fi
say "the package stands alone: $moved"
