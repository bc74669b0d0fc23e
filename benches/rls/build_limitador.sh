#!/usr/bin/env bash
# Builds Limitador's `limitador-server` (Kuadrant's Rust rate-limit service for Envoy, the peer
# of floodgate's RLS in benches/rls/run.py) in release mode, from its repository.
#
#   benches/rls/build_limitador.sh [SOURCE] [TARGET_DIR]
#
# SOURCE      a Limitador checkout (built in place), or anything `git clone` takes (a URL or a
#             bare git dir), cloned into SOURCE_DIR (default: TARGET_DIR's sibling
#             `limitador-src`). Default: https://github.com/Kuadrant/limitador.git
# TARGET_DIR  cargo's target dir (default: ~/.cache/floodgate/limitador-target). The binary is
#             TARGET_DIR/release/limitador-server, where benches/rls/run.py looks for it
#             (or pass it as `run.py --limitador PATH`).
#
# What it changes and why:
#   * limitador-no-rocksdb.patch (beside this script, made against Limitador 2981b2b, May 2026)
#     puts the server's `disk` storage behind a `disk_storage` feature, default on as upstream,
#     and the build turns it off (--no-default-features): the `limitador` crate's default
#     disk_storage feature pulls in RocksDB, a long C++ build, for a storage the benchmark does
#     not measure. The patch also compiles the `limitador` crate's binary counter-key encoding
#     (keys.rs `bin`, Counter::variables_for_key) without that feature: upstream gates it on
#     disk_storage, yet its Redis storages call it, so `redis_storage` alone does not build.
#     memory, redis and redis_cached run unchanged. LIMITADOR_DISK=1 skips the patch and builds
#     upstream's default features (needs clang and much longer).
#   * OPENSSL_NO_VENDOR=1: openssl-sys links the system's libssl (libssl-dev) instead of
#     building the `vendored` OpenSSL from source. Limitador's RLS path does not use TLS.
#   * Limitador's own release profile (lto = true, codegen-units = 1) is kept: the peer is
#     measured as it ships.
#   * Files named *.profraw (coverage output committed to the repository) are not checked out:
#     some mirrors hold them as absent large blobs, which would fail the checkout.
# It installs protobuf-compiler (tonic-prost-build runs protoc), pkg-config and libssl-dev with
# apt-get when missing (with sudo when not root). The build runs under `nice -n 10`.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
source=${1:-https://github.com/Kuadrant/limitador.git}
target=${2:-$HOME/.cache/floodgate/limitador-target}
patch="$here/limitador-no-rocksdb.patch"
sudo=""
[ "$(id -u)" = 0 ] || sudo=sudo

need=()
command -v protoc >/dev/null || need+=(protobuf-compiler)
command -v pkg-config >/dev/null || need+=(pkg-config)
pkg-config --exists openssl 2>/dev/null || need+=(libssl-dev)
if [ "${LIMITADOR_DISK:-0}" = 1 ]; then command -v clang >/dev/null || need+=(clang libclang-dev); fi
if [ ${#need[@]} -gt 0 ]; then
  $sudo apt-get update -qq
  $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}"
fi

if [ -f "$source/limitador-server/Cargo.toml" ]; then
  src=$(cd "$source" && pwd)
else
  src=${SOURCE_DIR:-$(dirname "$target")/limitador-src}
  if [ ! -f "$src/limitador-server/Cargo.toml" ]; then
    git clone --no-checkout "$source" "$src"
    git -C "$src" sparse-checkout set --no-cone '/*' '!*.profraw'
    git -C "$src" checkout
  fi
fi
echo "limitador: source $src ($(git -C "$src" rev-parse --short HEAD 2>/dev/null || echo 'not a git checkout'))"

features=(--no-default-features)
if [ "${LIMITADOR_DISK:-0}" = 1 ]; then
  features=()
elif (cd "$src" && git apply --check "$patch" 2>/dev/null); then
  (cd "$src" && git apply "$patch")
  echo "limitador: applied $(basename "$patch")"
elif (cd "$src" && git apply -R --check "$patch" 2>/dev/null); then
  echo "limitador: $(basename "$patch") already applied"
else
  echo "limitador: $(basename "$patch") does not apply to this revision; build it with RocksDB:" >&2
  echo "  LIMITADOR_DISK=1 $0 $*" >&2
  exit 1
fi

cd "$src"
CARGO_TARGET_DIR="$target" CARGO_INCREMENTAL=0 OPENSSL_NO_VENDOR=1 \
  nice -n 10 cargo build --release --locked -p limitador-server "${features[@]}"
echo "limitador: built $target/release/limitador-server"
"$target/release/limitador-server" --version
