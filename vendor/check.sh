#!/usr/bin/env bash
# Checks that each vendored crate under vendor/ is exactly the crate published on crates.io
# plus floodgate's patch series:
#
#   published <crate>-<version>.crate  (version: the vendored package's entry in Cargo.lock)
#   + vendor/patches/<crate>-<version>/NNNN-*.patch, in order (patch -p1, no fuzz)
#   - the files listed in vendor/patches/<crate>-<version>/removed-files
#   == vendor/<crate>/, byte for byte (diff -r)
#
# Usage: bash vendor/check.sh   (from anywhere; needs cargo, patch, diff, tar, sha256sum and
# access to crates.io, or the crates already in cargo's cache). It writes nothing in the
# repository: the pristine crates are fetched through a throwaway manifest in a temporary
# directory (into cargo's own cache, $CARGO_HOME or ~/.cargo), and the temporary directory is
# removed on exit.
set -euo pipefail

vendor_dir=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(dirname "$vendor_dir")
lock="$root/Cargo.lock"
crates=(http pingora-core pingora-http pingora-proxy pingora-timeout)

die() {
    echo "check.sh: $*" >&2
    exit 1
}

for tool in cargo patch diff tar sha256sum awk; do
    command -v "$tool" >/dev/null 2>&1 || die "'$tool' is needed and was not found"
done
[ -f "$lock" ] || die "no Cargo.lock at $lock"

tmp=$(mktemp -d "${TMPDIR:-/tmp}/floodgate-vendor-check.XXXXXX")
trap 'rm -rf "$tmp"' EXIT

# The version of the vendored (path) package `$1` in Cargo.lock: its [[package]] entry has no
# `source` line (the registry's entries of the same name, if any, have one).
locked_version() {
    awk -v want="$1" '
        function flush() { if (name == want && src == "" && ver != "") print ver }
        /^\[\[package\]\]/ { flush(); name = ""; ver = ""; src = ""; next }
        /^name = /    { name = $3; gsub(/"/, "", name) }
        /^version = / { ver = $3; gsub(/"/, "", ver) }
        /^source = /  { src = $3 }
        END { flush() }
    ' "$lock"
}

# The `version` of the [package] section of a Cargo.toml.
manifest_version() {
    awk '
        /^\[/ { in_pkg = ($0 == "[package]") }
        in_pkg && /^version = / { v = $3; gsub(/"/, "", v); print v; exit }
    ' "$1"
}

declare -A version
for c in "${crates[@]}"; do
    v=$(locked_version "$c")
    [ -n "$v" ] || die "$c: no vendored (path) entry for it in $lock"
    [ "$(printf '%s\n' "$v" | wc -l)" -eq 1 ] || die "$c: several vendored entries in $lock"
    [ -d "$vendor_dir/$c" ] || die "$c: no vendor/$c"
    mv=$(manifest_version "$vendor_dir/$c/Cargo.toml")
    [ "$mv" = "$v" ] || die "$c: Cargo.lock says $v but vendor/$c/Cargo.toml says $mv"
    [ -d "$vendor_dir/patches/$c-$v" ] || die "$c: no patch series vendor/patches/$c-$v for the locked version $v"
    version[$c]=$v
done

# A throwaway manifest that depends on exactly those versions; `cargo fetch` brings their
# published .crate files into cargo's cache (checked against the index's checksums).
mkdir -p "$tmp/pristine/src"
{
    printf '[package]\nname = "floodgate-vendor-pristine"\nversion = "0.0.0"\nedition = "2021"\npublish = false\n\n'
    printf '[dependencies]\n'
    for c in "${crates[@]}"; do
        printf '%s = { version = "=%s", default-features = false }\n' "$c" "${version[$c]}"
    done
    # its own workspace, whatever directory it is in
    printf '\n[workspace]\n'
} >"$tmp/pristine/Cargo.toml"
: >"$tmp/pristine/src/lib.rs"

# Run cargo from the temp dir, so that no .cargo/config.toml of the repository applies, and
# with a target dir there (nothing is built, but nothing may be written in the repository).
if ! (cd "$tmp/pristine" && CARGO_TARGET_DIR="$tmp/target" cargo fetch --quiet) >"$tmp/fetch.log" 2>&1; then
    cat "$tmp/fetch.log" >&2
    die "cargo fetch of the published crates failed"
fi
if ! (cd "$tmp/pristine" && CARGO_TARGET_DIR="$tmp/target" cargo metadata --format-version 1 --offline) >"$tmp/metadata.json" 2>"$tmp/metadata.log"; then
    cat "$tmp/metadata.log" >&2
    die "cargo metadata of the throwaway manifest failed"
fi

# The checksum of package $1 version $2 in the throwaway lock file.
pristine_checksum() {
    awk -v want="$1" -v wantv="$2" '
        /^\[\[package\]\]/ { name = ""; ver = "" }
        /^name = /     { name = $3; gsub(/"/, "", name) }
        /^version = /  { ver = $3; gsub(/"/, "", ver) }
        /^checksum = / { if (name == want && ver == wantv) { c = $3; gsub(/"/, "", c); print c } }
    ' "$tmp/pristine/Cargo.lock"
}

failed=()
for c in "${crates[@]}"; do
    v=${version[$c]}
    series="$vendor_dir/patches/$c-$v"
    work="$tmp/$c-$v"

    # Where cargo keeps the crate: .../registry/src/<index>/<crate>-<version>/Cargo.toml.
    manifest=$(grep -o '"manifest_path":"[^"]*/'"$c-$v"'/Cargo.toml"' "$tmp/metadata.json" \
        | head -n 1 | sed 's/^"manifest_path":"//; s/"$//')
    [ -n "$manifest" ] || die "$c $v: cargo metadata does not name its source"
    unpacked=$(dirname "$manifest")
    archive="${unpacked/\/registry\/src\//\/registry\/cache\/}.crate"

    # The pristine tree: the published .crate itself when cargo's cache has it (its sha256
    # checked against the lock), else cargo's unpacked copy of it without cargo's own marker.
    if [ -f "$archive" ]; then
        want=$(pristine_checksum "$c" "$v")
        got=$(sha256sum "$archive" | awk '{ print $1 }')
        [ -n "$want" ] && [ "$want" = "$got" ] || die "$c $v: $archive does not have the checksum of the registry ($want)"
        mkdir -p "$tmp/extract-$c"
        tar -xzf "$archive" -C "$tmp/extract-$c"
        [ -d "$tmp/extract-$c/$c-$v" ] || die "$c $v: $archive does not hold $c-$v/"
        mv "$tmp/extract-$c/$c-$v" "$work"
    else
        [ -d "$unpacked" ] || die "$c $v: neither $archive nor $unpacked exists after cargo fetch"
        cp -R "$unpacked" "$work"
        rm -f "$work/.cargo-ok"
    fi

    # The series, in order.
    patches=()
    while IFS= read -r p; do
        patches+=("$p")
    done < <(find "$series" -maxdepth 1 -type f -name '[0-9][0-9][0-9][0-9]-*.patch' | LC_ALL=C sort)
    [ "${#patches[@]}" -gt 0 ] || die "$c $v: no patches in $series"
    for p in "${patches[@]}"; do
        if ! patch -d "$work" -p1 --no-backup-if-mismatch -s --fuzz=0 --force --reject-file=- \
            -i "$p" </dev/null >"$tmp/patch.log" 2>&1; then
            cat "$tmp/patch.log" >&2
            die "$c $v: $(basename "$p") does not apply (without fuzz) after the patches before it"
        fi
    done

    # The published files that vendor/ does not keep.
    removed="$series/removed-files"
    [ -f "$removed" ] || die "$c $v: no $removed"
    while IFS= read -r f || [ -n "$f" ]; do
        case "$f" in '' | '#'*) continue ;; esac
        [ -f "$work/$f" ] || die "$c $v: removed-files lists '$f', which the patched crate does not have"
        rm -f "$work/$f"
    done <"$removed"
    find "$work" -depth -mindepth 1 -type d -empty -delete

    if diff -r "$work" "$vendor_dir/$c" >"$tmp/diff.log" 2>&1; then
        echo "$c $v: ${#patches[@]} patches reproduce vendor/$c"
    else
        {
            echo "FAIL: $c $v: the published crate with vendor/patches/$c-$v applied differs from vendor/$c:"
            diff -rq "$work" "$vendor_dir/$c" | sed "s|$work|<patched $c-$v>|g; s|$vendor_dir/|vendor/|g; s|^|  |" || true
            echo "  (first lines of the differences:)"
            sed "s|$work|<patched $c-$v>|g; s|$vendor_dir/|vendor/|g; s|^|    |" "$tmp/diff.log" | head -n 40
        } >&2
        failed+=("$c")
    fi
done

if [ "${#failed[@]}" -gt 0 ]; then
    die "vendor/ is not reproduced for: ${failed[*]}"
fi
