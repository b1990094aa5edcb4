# shellcheck shell=bash
# Sourced by build_here.sh, rehearse_here.sh and first_run.sh: the carried binaries travel
# xz-compressed (.gpu-carry/NAME.xz): their sm_90 fatbins are stored uncompressed and shrink about
# tenfold, which keeps a device call far under its 64 MiB.

# The programs that are carried.
carry_names=(test_cuda resnet50_synthetic)

# unpack_carry CARRY DEST: writes DEST/NAME for every carried NAME (from CARRY/NAME.xz, or
# CARRY/NAME as it is), checks each against the sha256 in CARRY/MANIFEST, and prints one line
# per program. Returns 1 (after saying why) when one is missing, does not unpack or differs.
unpack_carry() {
  local carry=$1 dest=$2 name want got
  mkdir -p "$dest"
  for name in "${carry_names[@]}"; do
    if [[ -f $carry/$name.xz ]]; then
      if command -v xz > /dev/null; then
        xz -dc "$carry/$name.xz" > "$dest/$name" || { echo "unpack: $name.xz: xz failed"; return 1; }
      else
        python3 -c 'import lzma, shutil, sys
with lzma.open(sys.argv[1]) as i, open(sys.argv[2], "wb") as o: shutil.copyfileobj(i, o)' \
          "$carry/$name.xz" "$dest/$name" || { echo "unpack: $name.xz: python's lzma failed"; return 1; }
      fi
    elif [[ -f $carry/$name ]]; then
      cp "$carry/$name" "$dest/$name"
    else
      echo "unpack: $carry/$name.xz missing: run scripts/gpu/build_here.sh on the dev machine"
      return 1
    fi
    chmod +x "$dest/$name"
    want=$(awk -v n="$name" '$1 == "sha256" && $3 == n {print $2}' "$carry/MANIFEST" 2> /dev/null)
    got=$(sha256sum "$dest/$name" | cut -d' ' -f1)
    if [[ -n $want && $want != "$got" ]]; then
      echo "unpack: $name: sha256 $got, but MANIFEST says $want"
      return 1
    fi
    echo "unpacked $name: $(stat -c %s "$dest/$name") bytes, sha256 ${got:0:16}${want:+ (as in MANIFEST)}"
  done
}
