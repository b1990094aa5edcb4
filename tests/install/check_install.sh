#!/usr/bin/env bash
# Proves that an installed dltrain stands alone: installs BUILD_DIR into a scratch prefix,
# moves the prefix elsewhere, makes the checkout unreachable, then builds tests/install/
# against the moved prefix through CMake and through pkg-config, runs both, and runs every
# installed program. No installed file may name the checkout, the build tree or the prefix it
# was installed to; the prefix's own libraries (libdltrain.so, the bundled libdnnl.so.3) must
# be found through RUNPATHs relative to $ORIGIN, and loaded from the moved prefix.
#
#   tests/install/check_install.sh BUILD_DIR WORK_DIR
#
# "Unreachable": the consumers are built and run in a private mount namespace (unshare; as
# root, or in a user namespace) in which an empty tmpfs covers the whole checkout and the build
# tree, so nothing there is visible to them and nothing is renamed for other processes. Where
# unshare is not allowed (some containers), or with DLTRAIN_INSTALL_CHECK_HIDE=rename, BUILD_DIR
# and the checkout's private dependencies (ROOT/.deps: PyPI's oneDNN from scripts/setup.sh) are
# renamed to NAME.hidden-by-check-install instead, and renamed back on exit, also on failure or
# Ctrl-C (a run killed with SIGKILL leaves them renamed: the next run renames them back first;
# other builds in the same checkout must not run meanwhile).
# WORK_DIR must lie outside the checkout; the moved prefix is left in WORK_DIR/elsewhere/dltrain
# (printed last) for further checks. Every check runs; the exit status is 1 if any failed.
# Environment: JOBS (2), DLTRAIN_INSTALL_CHECK_HIDE (auto, namespace, rename).
set -uo pipefail
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
failed=0
jobs=${JOBS:-2}
is_elf() { [[ -f $1 && ! -L $1 && $(head -c 4 "$1" | od -An -c | tr -d ' ') == '177ELF' ]]; }
elves() {  # the ELF files under $1, NUL-separated
  local f
  while IFS= read -r -d '' f; do
    if is_elf "$f"; then printf '%s\0' "$f"; fi
  done < <(find "$1" -type f -print0 | sort -z)
}
own_libs() {  # the NEEDED libraries of $1 that the prefix itself installs (in $libdir)
  local n
  for n in $(readelf -d "$1" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p'); do
    if [[ -e $libdir/$n ]]; then echo "$n"; fi
  done
}

# --- the consumer side: `check_install.sh --consume PREFIX WORK_DIR`, run with the checkout
# out of reach ---------------------------------------------------------------------------
if [[ ${1:-} == --consume ]]; then
  moved=$2 work=$3
  libdir=$(dirname "$(dirname "$(find "$moved" -name dltrain.pc | head -1)")")
  # check_loads FILE [LD_LIBRARY_PATH]: every library found, the prefix's own from the prefix.
  check_loads() {
    local f=$1 out n at
    out=$(env -u LD_LIBRARY_PATH ${2:+LD_LIBRARY_PATH=$2} ldd "$f" 2>&1)
    if grep -q 'not found' <<< "$out"; then
      bad "${f#"$work"/}: libraries not found:"$'\n'"$(grep 'not found' <<< "$out")"
    fi
    for n in $(own_libs "$f"); do
      at=$(sed -n "s|^[[:space:]]*$n => \(/[^ ]*\) .*|\1|p" <<< "$out")
      if [[ -z $at || $(dirname "$(realpath "$at")") != "$(realpath "$libdir")" ]]; then
        bad "${f#"$work"/} does not load $n from $libdir:"$'\n'"$(grep -F "$n" <<< "$out")"
      fi
    done
  }
  while IFS= read -r -d '' f; do
    check_loads "$f"
    if [[ $f == "$moved"/bin/* ]]; then
      run "${f#"$moved"/} --help" "$f" --help && say "ran ${f#"$moved"/} --help"
    fi
  done < <(elves "$moved")

  # The consumer project (copied out of the checkout) through find_package(dltrain).
  if run "configure the CMake consumer against $moved" \
    env -u LD_LIBRARY_PATH cmake -S "$work/src" -B "$work/consumer/cmake" -DCMAKE_BUILD_TYPE=Release \
    "-DCMAKE_PREFIX_PATH=$moved${CMAKE_PREFIX_PATH:+;$CMAKE_PREFIX_PATH}" &&
    run "build the CMake consumer" cmake --build "$work/consumer/cmake" -j "$jobs"; then
    check_loads "$work/consumer/cmake/consumer"
    run "run the CMake consumer" env -u LD_LIBRARY_PATH "$work/consumer/cmake/consumer" &&
      say "ran the CMake consumer"
  fi

  # The same through dltrain.pc alone; at run time LD_LIBRARY_PATH names the directories of
  # its -L flags (what modules set): the prefix's lib directory, and those of dependencies
  # outside the package (a site oneDNN), never the checkout (checked above).
  pc() { PKG_CONFIG_PATH="$libdir/pkgconfig" pkg-config "$@"; }
  pc_libdir=$(pc --variable=libdir dltrain)
  if [[ $(cd "$pc_libdir" 2> /dev/null && pwd) != "$libdir" ]]; then
    bad "dltrain.pc's libdir is '$pc_libdir', not $libdir"
  fi
  pc_ld=$(pc --static --libs-only-L dltrain | tr ' ' '\n' | sed -n 's/^-L//p' | paste -sd:)
  # shellcheck disable=SC2046
  if run "build the pkg-config consumer" c++ -O1 -o "$work/consumer/consumer_pc" \
    "$work/src/main.cpp" $(pc --cflags --libs dltrain); then
    check_loads "$work/consumer/consumer_pc" "$pc_ld"
    run "run the pkg-config consumer" env LD_LIBRARY_PATH="$pc_ld" "$work/consumer/consumer_pc" &&
      say "ran the pkg-config consumer"
  fi
  exit "$failed"
fi

if [[ $# -ne 2 ]]; then
  echo "usage: $0 BUILD_DIR WORK_DIR" >&2
  exit 2
fi
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
for p in "${1%/}" "$root/.deps"; do  # renamed by a killed run (rename mode): rename back
  if [[ -e $p.hidden-by-check-install && ! -e $p ]]; then mv "$p.hidden-by-check-install" "$p"; fi
done
build=$(cd "$1" && pwd) || exit 2
mkdir -p "$2" && work=$(cd "$2" && pwd) || exit 2
if [[ $work/ == "$root"/* || $work/ == "$build"/* ]]; then
  echo "check_install: WORK_DIR ($work) must lie outside the checkout and the build tree" >&2
  exit 2
fi
staging=$work/staging/usr
moved=$work/elsewhere/dltrain

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
libdir=$(dirname "$(dirname "$(find "$moved" -name dltrain.pc | head -1)")")
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
while IFS= read -r -d '' f; do check_own_runpath "$f"; done < <(elves "$moved")

# --- the checkout out of reach: a private mount namespace, or renames ---------------------
mkdir -p "$work/src" && cp "$here/CMakeLists.txt" "$here/main.cpp" "$here/check_install.sh" "$work/src/"
mode=${DLTRAIN_INSTALL_CHECK_HIDE:-auto}
unshare_cmd=(unshare --mount --propagation private)
if [[ $(id -u) != 0 ]]; then unshare_cmd=(unshare --user --map-root-user --mount --propagation private); fi
if [[ $mode == auto ]]; then
  mode=rename
  # shellcheck disable=SC2016
  if command -v unshare > /dev/null &&
    "${unshare_cmd[@]}" sh -c 'mount -t tmpfs tmpfs "$1"' _ "$work/src" 2> /dev/null; then
    mode=namespace
  fi
fi
if [[ $mode == namespace ]]; then
  say "consumers build and run in a mount namespace where $root and $build are empty"
  # shellcheck disable=SC2016
  "${unshare_cmd[@]}" bash -c '
    set -e
    mount -t tmpfs -o ro,mode=755 tmpfs "$2"  # the build tree (first: it may lie in the checkout)
    mount -t tmpfs -o ro,mode=755 tmpfs "$1"  # the checkout
    if [[ -n $(ls -A "$1") || ( -e $2 && -n $(ls -A "$2") ) ]]; then
      echo "check_install: FAIL: the checkout is still visible" >&2
      exit 1
    fi
    exec bash "$3" --consume "$4" "$5"' _ "$root" "$build" "$work/src/check_install.sh" "$moved" "$work" ||
    failed=1
else
  suffix=.hidden-by-check-install
  hidden=()
  restore() {
    local p
    for p in "${hidden[@]}"; do
      mv "$p$suffix" "$p" || echo "check_install: could not rename $p$suffix back to $p" >&2
    done
    hidden=()
  }
  child=
  trap restore EXIT
  # The consumers run in the background so that a signal is handled at once (bash defers
  # traps until a foreground child ends): they are stopped and the names restored.
  trap 'if [[ -n $child ]]; then kill "$child" 2> /dev/null; fi; exit 130' INT TERM HUP
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
  hide "$build"
  hide "$root/.deps"
  say "consumers build and run with ${hidden[*]:-nothing} renamed to NAME$suffix"
  bash "$work/src/check_install.sh" --consume "$moved" "$work" &
  child=$!
  wait "$child" || failed=1
  child=
  restore
fi

if [[ $failed != 0 ]]; then
  say "the installed package in $moved does not stand alone (failures above)"
  exit 1
fi
say "the package stands alone: $moved"
