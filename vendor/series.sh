#!/usr/bin/env bash
# The vendored crates under vendor/ as the crates published on crates.io plus floodgate's
# patch series:
#
#   published <crate>-<version>.crate  (version: the vendored package's entry in Cargo.lock)
#   + vendor/patches/<crate>-<version>/NNNN-*.patch, in order (patch -p1, no fuzz)
#   - the files listed in vendor/patches/<crate>-<version>/removed-files
#   == vendor/<crate>/, byte for byte (diff -r)
#
# Usage (from anywhere; needs cargo, patch, diff, tar, sha256sum, awk, and git for unpack and
# pack; access to crates.io, or the crates already in cargo's cache):
#
#   bash vendor/series.sh [check]            checks every vendored crate (`make vendor-check`)
#   bash vendor/series.sh unpack CRATE DIR   a git repository in DIR (new): one commit of the
#                                            published crate, one per patch (its message the
#                                            patch's name and header), one of the removed files
#   bash vendor/series.sh pack CRATE DIR     the reverse: rewrites vendor/patches/CRATE-VERSION/
#                                            (patches, removed-files) from DIR's commits and
#                                            vendor/CRATE/ from DIR's last commit
#   bash vendor/series.sh upgrade CRATE DIR VERSION
#                                            in a repository made by unpack: commits the
#                                            published VERSION and rebases the series onto it
#                                            (git's three-way merge; a conflict stops the
#                                            rebase for you to resolve); pack then writes
#                                            vendor/patches/CRATE-VERSION/ and vendor/CRATE/
#   bash vendor/series.sh tree CRATE N DIR   the published crate with the first N patches of
#                                            its series (0: as published) in DIR (new), every
#                                            published file kept (benches/patches builds these)
#   bash vendor/series.sh test               the upstream unit tests of the files the series
#                                            of pingora-core and pingora-proxy touch, run on
#                                            the published crates with the series applied and
#                                            their dev-dependencies back, resolved from
#                                            floodgate's Cargo.lock (`make vendor-test`)
#
# Between unpack and pack, edit the series with git: amend or fixup the commit of the item
# a change belongs to (`git rebase -i`), reword a header, add a commit for a new item. pack
# renumbers the patches in commit order and writes each header's "Files (hunks)" line.
# check writes nothing in the repository: the pristine crates are fetched through a throwaway
# manifest in a temporary directory (into cargo's own cache, $CARGO_HOME or ~/.cargo), and the
# temporary directory is removed on exit.
set -euo pipefail

die() {
    echo "series.sh: $*" >&2
    exit 1
}

vendor_dir=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(dirname "$vendor_dir")
lock="$root/Cargo.lock"
crates=(pingora-core pingora-http pingora-proxy pingora-timeout)

command=${1:-check}
case "$command" in
check) [ $# -le 1 ] || die "usage: series.sh [check]" ;;
tree)
    [ $# -eq 4 ] || die "usage: series.sh tree CRATE N DIR"
    one=$2
    count=$3
    dir=$4
    case "$count" in '' | *[!0-9]*) die "N must be a number of patches" ;; esac
    found=
    for c in "${crates[@]}"; do [ "$c" = "$one" ] && found=1; done
    [ -n "$found" ] || die "$one is not a vendored crate (${crates[*]})"
    crates=("$one")
    ;;
test)
    [ $# -eq 1 ] || die "usage: series.sh test"
    crates=(pingora-core pingora-proxy)
    ;;
unpack | pack | upgrade)
    if [ "$command" = upgrade ]; then
        [ $# -eq 4 ] || die "usage: series.sh upgrade CRATE DIR VERSION"
        to_version=$4
    else
        [ $# -eq 3 ] || die "usage: series.sh $command CRATE DIR"
    fi
    one=$2
    dir=$3
    found=
    for c in "${crates[@]}"; do [ "$c" = "$one" ] && found=1; done
    [ -n "$found" ] || die "$one is not a vendored crate (${crates[*]})"
    crates=("$one")
    command -v git >/dev/null 2>&1 || die "'git' is needed and was not found"
    ;;
*) die "unknown command '$command' (check, unpack CRATE DIR, pack CRATE DIR, upgrade CRATE DIR VERSION, tree CRATE N DIR, test)" ;;
esac

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

# upgrade fetches the version it moves to (the repository holds the one it moves from).
if [ "$command" = upgrade ]; then
    version[$one]=$to_version
fi

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

# The published tree of crate $1 version $2 in $3 (new): the .crate itself when cargo's
# cache has it (its sha256 checked against the lock), else cargo's unpacked copy of it
# without cargo's own marker.
pristine_tree() {
    local c=$1 v=$2 work=$3 manifest unpacked archive want got
    # Where cargo keeps the crate: .../registry/src/<index>/<crate>-<version>/Cargo.toml.
    manifest=$(grep -o '"manifest_path":"[^"]*/'"$c-$v"'/Cargo.toml"' "$tmp/metadata.json" \
        | head -n 1 | sed 's/^"manifest_path":"//; s/"$//')
    [ -n "$manifest" ] || die "$c $v: cargo metadata does not name its source"
    unpacked=$(dirname "$manifest")
    archive="${unpacked/\/registry\/src\//\/registry\/cache\/}.crate"
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
}

# The patches of a series directory $1, in order, one a line.
series_patches() {
    find "$1" -maxdepth 1 -type f -name '[0-9][0-9][0-9][0-9]-*.patch' | LC_ALL=C sort
}

# Applies patch $2 to the tree $1 (no fuzz, no backup files); dies naming it if it fails.
apply_patch() {
    if ! patch -d "$1" -p1 --no-backup-if-mismatch -s --fuzz=0 --force --reject-file=- \
        -i "$2" </dev/null >"$tmp/patch.log" 2>&1; then
        cat "$tmp/patch.log" >&2
        die "$(basename "$(dirname "$2")"): $(basename "$2") does not apply (without fuzz) after the patches before it"
    fi
}

# Removes from tree $1 the files listed in removed-files $2, then the directories left empty.
remove_files() {
    local work=$1 removed=$2 f
    [ -f "$removed" ] || die "no $removed"
    while IFS= read -r f || [ -n "$f" ]; do
        case "$f" in '' | '#'*) continue ;; esac
        [ -f "$work/$f" ] || die "$removed lists '$f', which the patched crate does not have"
        rm -f "$work/$f"
    done <"$removed"
    find "$work" -depth -mindepth 1 -type d -empty -not -path '*/.git/*' -not -name .git -delete
}

# The header of patch $1: its lines before the first file's `--- ` line, without the
# "Files (hunks)" line pack writes and without trailing blank lines.
patch_header() {
    awk '
        /^--- (a\/|\/dev\/null)/ { exit }
        /^Files \(hunks\): / { skip = 1; next }
        skip && /^$/ { skip = 0; next }
        { skip = 0; lines[++n] = $0 }
        END { while (n > 0 && lines[n] == "") n--; for (i = 1; i <= n; i++) print lines[i] }
    ' "$1"
}

check() {
    local c v series work p failed=() n
    for c in "${crates[@]}"; do
        v=${version[$c]}
        series="$vendor_dir/patches/$c-$v"
        work="$tmp/$c-$v"
        pristine_tree "$c" "$v" "$work"
        n=0
        while IFS= read -r p; do
            apply_patch "$work" "$p"
            n=$((n + 1))
        done < <(series_patches "$series")
        [ "$n" -gt 0 ] || die "$c $v: no patches in $series"
        remove_files "$work" "$series/removed-files"
        if diff -r "$work" "$vendor_dir/$c" >"$tmp/diff.log" 2>&1; then
            echo "$c $v: $n patches reproduce vendor/$c"
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
}

# A commit of everything in the work tree of repository $1 with message file $2.
commit_all() {
    git -C "$1" add -A
    git -C "$1" -c user.name=floodgate -c user.email=floodgate@localhost \
        commit -q --allow-empty --no-verify -F "$2"
}

unpack() {
    local c=${crates[0]} v=${version[${crates[0]}]} series p name
    series="$vendor_dir/patches/$c-$v"
    [ ! -e "$dir" ] || die "$dir exists; unpack makes a new directory"
    pristine_tree "$c" "$v" "$dir"
    git -C "$dir" init -q --initial-branch=series
    printf 'published %s %s\n' "$c" "$v" >"$tmp/msg"
    commit_all "$dir" "$tmp/msg"
    git -C "$dir" tag published
    while IFS= read -r p; do
        apply_patch "$dir" "$p"
        name=$(basename "$p" .patch)
        { printf '%s\n\n' "$name"; patch_header "$p"; } >"$tmp/msg"
        commit_all "$dir" "$tmp/msg"
    done < <(series_patches "$series")
    remove_files "$dir" "$series/removed-files"
    { printf 'removed-files\n\n'; sed -n '/^#/p' "$series/removed-files"; } >"$tmp/msg"
    commit_all "$dir" "$tmp/msg"
    diff -r -x .git "$dir" "$vendor_dir/$c" >/dev/null || die "$dir differs from vendor/$c: run check"
    echo "$dir: $c $v, published + $(series_patches "$series" | wc -l) patches + removed-files; edit with git, then: bash vendor/series.sh pack $c $dir"
}

# The "Files (hunks)" line of a diff on stdin: each file's path and count of hunks.
files_line() {
    awk '
        /^\+\+\+ / { f = $2; if (f == "/dev/null") f = prev; sub(/^b\//, "", f); if (!(f in n)) order[++k] = f; n[f] += 0; next }
        /^--- / { prev = $2; sub(/^a\//, "", prev); next }
        /^@@ / { n[f]++ }
        END { printf "Files (hunks): "; for (i = 1; i <= k; i++) printf "%s%s (%d)", (i > 1 ? ", " : ""), order[i], n[order[i]]; print "" }
    '
}

pack() {
    local c=${crates[0]} v series commits last i=0 sha name body out old
    [ -d "$dir/.git" ] || die "$dir is not a repository made by unpack"
    # The version the series applies to: the one of the published commit it is based on.
    v=$(git -C "$dir" log -1 --format=%s published 2>/dev/null | sed -n "s/^published $c //p")
    [ -n "$v" ] || die "$dir: its 'published' commit does not name a version of $c"
    series="$vendor_dir/patches/$c-$v"
    git -C "$dir" diff --quiet HEAD && git -C "$dir" diff --cached --quiet \
        || die "$dir has uncommitted changes: commit them to the item they belong to"
    git -C "$dir" rev-parse -q --verify published >/dev/null || die "$dir has no 'published' tag"
    mapfile -t commits < <(git -C "$dir" rev-list --reverse published..HEAD)
    [ "${#commits[@]}" -ge 2 ] || die "$dir: no patches after 'published'"
    last=${commits[-1]}
    [ "$(git -C "$dir" log -1 --format=%s "$last")" = removed-files ] \
        || die "$dir: the last commit must be the one of removed-files"
    out="$tmp/series"
    mkdir -p "$out"
    for sha in "${commits[@]:0:${#commits[@]}-1}"; do
        name=$(git -C "$dir" log -1 --format=%s "$sha" | sed 's/^[0-9]\{4\}-//')
        [ -n "$name" ] || die "$dir: commit $sha has no subject (the patch's name)"
        git -C "$dir" diff --no-color --no-renames --no-ext-diff -U3 \
            --src-prefix=a/ --dst-prefix=b/ "$sha^" "$sha" \
            | grep -v '^\(diff --git \|index \|new file mode \|deleted file mode \|old mode \|new mode \)' \
            >"$tmp/diff" || true
        [ -s "$tmp/diff" ] || die "$dir: commit $sha ($name) changes nothing"
        body=$(git -C "$dir" log -1 --format=%b "$sha" | sed -e :a -e '/^\n*$/{$d;N;ba' -e '}')
        {
            printf '%s\n\n' "$body"
            files_line <"$tmp/diff"
            printf '\n'
            cat "$tmp/diff"
        } >"$out/$(printf '%04d' "$i")-$name.patch"
        i=$((i + 1))
    done
    {
        git -C "$dir" log -1 --format=%b "$last" | sed '/^$/d'
        git -C "$dir" diff --no-renames --name-only --diff-filter=D published "$last" | LC_ALL=C sort
    } >"$out/removed-files"
    # A series moved to another version replaces the old one.
    for old in "$vendor_dir/patches/$c"-[0-9]*; do
        [ "$old" = "$series" ] || [ ! -d "$old" ] || rm -rf "$old"
    done
    mkdir -p "$series"
    rm -f "$series"/[0-9][0-9][0-9][0-9]-*.patch
    cp "$out"/* "$series"/
    mkdir -p "$tmp/tree"
    git -C "$dir" archive HEAD | tar -x -C "$tmp/tree"
    rm -rf "${vendor_dir:?}/$c"
    mv "$tmp/tree" "$vendor_dir/$c"
    echo "vendor/patches/$c-$v: $i patches and removed-files written; vendor/$c is $dir's last commit"
}

tree() {
    local c=${crates[0]} v=${version[${crates[0]}]} n=0 p
    [ ! -e "$dir" ] || die "$dir exists; tree makes a new directory"
    pristine_tree "$c" "$v" "$dir"
    while IFS= read -r p; do
        [ "$n" -lt "$count" ] || break
        apply_patch "$dir" "$p"
        n=$((n + 1))
    done < <(series_patches "$vendor_dir/patches/$c-$v")
    [ "$n" -eq "$count" ] || die "$c $v has $n patches, not $count"
}

upgrade() {
    local c=${crates[0]} v=$to_version from branch
    [ -d "$dir/.git" ] || die "$dir is not a repository made by unpack"
    git -C "$dir" diff --quiet HEAD && git -C "$dir" diff --cached --quiet \
        || die "$dir has uncommitted changes"
    from=$(git -C "$dir" log -1 --format=%s published | sed -n "s/^published $c //p")
    [ -n "$from" ] || die "$dir: its 'published' commit does not name a version of $c"
    [ "$from" != "$v" ] || die "$dir is already on $c $v"
    branch=$(git -C "$dir" symbolic-ref --short HEAD) || die "$dir: not on a branch (a rebase under way?)"
    pristine_tree "$c" "$v" "$tmp/new"
    # The new published tree as a commit of its own (no parent), then the series onto it.
    git -C "$dir" checkout -q --orphan "published-$v"
    git -C "$dir" rm -rq --cached . >/dev/null
    find "$dir" -mindepth 1 -maxdepth 1 ! -name .git -exec rm -rf {} +
    cp -R "$tmp/new/." "$dir/"
    printf 'published %s %s\n' "$c" "$v" >"$tmp/msg"
    commit_all "$dir" "$tmp/msg"
    git -C "$dir" checkout -q "$branch"
    git -C "$dir" tag -f "published-$from" published >/dev/null
    # The removed-files commit is made again on the new tree (a file the new version changed
    # would conflict with its deletion): the series is rebased without it.
    [ "$(git -C "$dir" log -1 --format=%s HEAD)" = removed-files ] \
        || die "$dir: the last commit must be the one of removed-files"
    git -C "$dir" log -1 --format=%b HEAD >"$tmp/removed-msg"
    git -C "$dir" diff --no-renames --name-only --diff-filter=D HEAD~1 HEAD >"$tmp/removed"
    git -C "$dir" reset -q --hard HEAD~1
    git -C "$dir" tag -f published "published-$v" >/dev/null
    if ! git -C "$dir" -c user.name=floodgate -c user.email=floodgate@localhost \
        rebase -q --onto "published-$v" "published-$from" "$branch"; then
        echo "$dir: a patch does not apply to $c $v as it is: resolve the conflict (git status), git rebase --continue until the series is done; then remove the files of $tmp/removed-files.txt (saved in $dir/.git/removed-files.txt) and commit them as 'removed-files' before pack" >&2
        cp "$tmp/removed" "$dir/.git/removed-files.txt"
        exit 2
    fi
    local f gone=0
    while IFS= read -r f; do
        if [ -e "$dir/$f" ]; then git -C "$dir" rm -q "$f"; else gone=$((gone + 1)); fi
    done <"$tmp/removed"
    { printf 'removed-files\n\n'; sed "s/$c $from/$c $v/g" "$tmp/removed-msg"; } >"$tmp/msg"
    commit_all "$dir" "$tmp/msg"
    echo "$dir: the series of $c $from is on $c $v ($gone removed files no longer published); review the files $c $v adds (git diff --stat published-$from published-$v), build, test and measure, then: bash vendor/series.sh pack $c $dir"
}

# Upstream unit tests of the touched files that are not run here, by name:
left_out=(
    # off loopback (1.1.1.1, TEST-NET-1's 192.0.2.1, 240.0.0.1), where only loopback is reachable
    connectors::tests::test_connect
    connectors::tests::test_connect_with_offload_timing
    connectors::tests::test_connect_tls
    connectors::tests::test_conn_timeout
    connectors::tests::test_conn_timeout_with_offload
    connectors::tests::test_connector_bind_to
    connectors::tests::test_do_connect_with_total_timeout
    connectors::tests::test_tls_connect_timeout_supersedes_total
    connectors::tests::test_do_connect_without_total_timeout
    connectors::http::tests::test_connect_h1
    connectors::http::tests::test_connect_h2
    connectors::http::tests::test_connect_h2_fallback_h1_reuse
    connectors::http::tests::test_connect_prefer_h1
    connectors::http::tests::test_custom_client_non_custom_upstream
    # they read tests/keys/, which the published crate does not ship
    connectors::http::tests::test_custom_client_custom_upstream
    listeners::test::test_listen_tls
    listeners::test::test_listen_tls_with_offload
)

# The [dev-dependencies] sections (plain and per target) of a published Cargo.toml $1 that the
# unit tests of crate tree $2 use (its src/ names the crate): the others serve the crate's
# integration tests, benches and examples, which are not kept, and would only lengthen the
# build.
dev_dependencies() {
    local used
    used=$(grep -rhoE '\b[a-z][a-z0-9_]*::|use [a-z][a-z0-9_]*' "$2/src" | sed 's/^use //; s/::$//' | LC_ALL=C sort -u | tr '\n' ' ')
    awk -v used=" $used " '
        /^\[/ {
            keep = 0
            if ($0 ~ /dev-dependencies\./) {
                name = $0
                sub(/.*dev-dependencies\./, "", name)
                sub(/\].*/, "", name)
                gsub(/"/, "", name)
                gsub(/-/, "_", name)
                keep = index(used, " " name " ") > 0
            }
        }
        keep { print }
    ' "$1"
}

# The source files (under src/) a series $1 touches, one a line.
series_files() {
    grep -h '^+++ b/src/.*\.rs$' "$1"/[0-9][0-9][0-9][0-9]-*.patch | sed 's|^+++ b/src/||' | LC_ALL=C sort -u
}

# The source file (under src/ of crate tree $1) that holds unit test $2: the file of the
# longest module path of its name (a::b::tests::t is in a/b.rs or a/b/mod.rs, else a.rs ...).
test_file() {
    local tree=$1 path=${2%::*} f
    while [ -n "$path" ]; do
        f=${path//:://}
        if [ -f "$tree/src/$f.rs" ]; then echo "$f.rs"; return; fi
        if [ -f "$tree/src/$f/mod.rs" ]; then echo "$f/mod.rs"; return; fi
        case "$path" in *::*) path=${path%::*} ;; *) path= ;; esac
    done
    echo lib.rs
}

test() {
    local ws="$root/target/vendor-tests" c v work names=() m p skipped
    # Built in the main target directory (or CARGO_TARGET_DIR): the dependencies floodgate's
    # own tests built are reused where their features match, which is most of them.
    local target="${CARGO_TARGET_DIR:-$root/target}"
    mkdir -p "$ws"
    for c in "${crates[@]}"; do
        v=${version[$c]}
        work="$tmp/tree-$c"
        pristine_tree "$c" "$v" "$work"
        cp "$work/Cargo.toml" "$tmp/$c.published.toml"
        while IFS= read -r p; do
            apply_patch "$work" "$p"
        done < <(series_patches "$vendor_dir/patches/$c-$v")
        dev_dependencies "$tmp/$c.published.toml" "$work" >>"$work/Cargo.toml"
        # The tree of the run before is kept when nothing changed: its files' times tell cargo
        # that its build is still good.
        if ! diff -rq "$work" "$ws/$c" >/dev/null 2>&1; then
            rm -rf "${ws:?}/$c"
            mv "$work" "$ws/$c"
        fi
    done
    {
        printf '# Written by vendor/series.sh test: the patched pingora-core and pingora-proxy with\n'
        printf '# their dev-dependencies, resolved from floodgate'"'"'s Cargo.lock.\n'
        printf '[workspace]\nresolver = "2"\nmembers = ["pingora-core", "pingora-proxy"]\n\n'
        printf '[patch.crates-io]\n'
        printf 'pingora-core = { path = "pingora-core" }\npingora-proxy = { path = "pingora-proxy" }\n'
        printf 'pingora-http = { path = "%s" }\npingora-timeout = { path = "%s" }\n' \
            "$vendor_dir/pingora-http" "$vendor_dir/pingora-timeout"
    } >"$ws/Cargo.toml"
    # Every version floodgate locks stays; only the dev-dependencies it lacks are added.
    cp "$lock" "$ws/Cargo.lock"
    for c in "${crates[@]}"; do
        v=${version[$c]}
        series_files "$vendor_dir/patches/$c-$v" >"$tmp/files"
        (cd "$ws" && CARGO_TARGET_DIR="$target" cargo test --quiet --lib -p "$c" --features rustls \
            -- --list --format terse) >"$tmp/list" || die "$c $v: unit tests do not build"
        # libtest's filters and --skip match substrings (connectors:: would take connectors::http's
        # tests, --skip test_connect test_connect_uds): the tests are listed, those of the
        # touched files kept by name, and run by name.
        names=()
        skipped=0
        while IFS= read -r m; do
            grep -qxF "$(test_file "$ws/$c" "$m")" "$tmp/files" || continue
            case " ${left_out[*]} " in *" $m "*) skipped=$((skipped + 1)); continue ;; esac
            names+=("$m")
        done < <(sed -n 's/: test$//p' "$tmp/list")
        [ "${#names[@]}" -gt 0 ] || die "$c $v: no unit tests in the files its series touches"
        echo "$c $v: ${#names[@]} unit tests of $(wc -l <"$tmp/files") touched files ($skipped left out: vendor/series.sh says why)"
        (cd "$ws" && CARGO_TARGET_DIR="$target" cargo test --quiet --lib -p "$c" --features rustls \
            -- --exact "${names[@]}") || die "$c $v: unit tests failed"
    done
    # The crates the two build against (their normal dependencies, all the way down) at the
    # versions floodgate's build uses: the dev-dependencies only added packages to the lock.
    for c in "${crates[@]}"; do
        (cd "$root" && cargo tree --quiet --offline -p "$c" -e normal --prefix none --format '{p}') \
            | sed 's/ (.*//' | LC_ALL=C sort -u >"$tmp/tree.main"
        (cd "$ws" && cargo tree --quiet --offline -p "$c" -e normal --features rustls --prefix none --format '{p}') \
            | sed 's/ (.*//' | LC_ALL=C sort -u >"$tmp/tree.tests"
        if [ -n "$(LC_ALL=C comm -13 "$tmp/tree.main" "$tmp/tree.tests")" ]; then
            LC_ALL=C comm -13 "$tmp/tree.main" "$tmp/tree.tests" | sed 's/^/  not in floodgate'"'"'s build: /' >&2
            die "$c: the unit tests built against other crates than floodgate's Cargo.lock gives it"
        fi
    done
}

"$command"
