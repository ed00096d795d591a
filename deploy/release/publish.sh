#!/usr/bin/env bash
# Builds, signs and lays out a release of the tag TAG into OUT, on a
# Debian 12 machine as root (what `cargo xtask deps` needs). Any CI runs
# it; .github/workflows/release.yml is GitHub's job around it.
#
#   PRJQUOTA_SIGNING_KEY=/path/to/release-key.asc deploy/release/publish.sh v0.2.0 out/
#
# PRJQUOTA_SIGNING_KEY is the release signing key, armored and without a
# passphrase (the job's secret). Its fingerprint must be the one
# SECURITY.md publishes, so that a release is never signed with a key
# operators were not told of. OUT receives:
#   OUT/site/      what the release publishes at https://prjquota.github.io/prjquota
#                  (apt/, yum/, prjquota-release-key.asc)
#   OUT/assets/    what the release attaches: the tarball, the packages, the
#                  debug symbols, SHA256SUMS and SHA256SUMS.asc
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."

fail() {
	echo "publish: $*" >&2
	exit 1
}

tag=${1:-}
out=${2:-}
[ -n "$tag" ] && [ -n "$out" ] || fail "usage: deploy/release/publish.sh vX.Y.Z OUT"
version=${tag#v}
grep -q "^version = \"$version\"$" Cargo.toml ||
	fail "the tag $tag is not the workspace's version (Cargo.toml [workspace.package]): bump it in a commit first"
[ "$(git rev-parse HEAD)" = "$(git rev-parse "$tag^{commit}")" ] ||
	fail "HEAD is not the commit $tag names: check out the tag"
[ -n "${PRJQUOTA_SIGNING_KEY:-}" ] && [ -f "$PRJQUOTA_SIGNING_KEY" ] ||
	fail "PRJQUOTA_SIGNING_KEY must name the release signing key's armored secret key file"

published=$(sed -n '/^## The release signing key/,$p' SECURITY.md | sed -n '/^```text$/{n;p;q}')
given=$(gpg --batch --show-keys --with-colons "$PRJQUOTA_SIGNING_KEY" | awk -F: '$1 == "fpr" { print $10; exit }')
[ -n "$given" ] || fail "no key in $PRJQUOTA_SIGNING_KEY"
[ "$published" = "$given" ] ||
	fail "the signing key's fingerprint $given is not the one SECURITY.md publishes ($published): publish the key's fingerprint there in a commit before its first release"

cargo xtask deps
cargo xtask dist

dist=target/dist
rm -rf "$out"
mkdir -p "$out/site" "$out/assets"
cp -a "$dist/apt" "$dist/yum" "$dist/prjquota-release-key.asc" "$out/site/"
for f in "prjquota-$version-x86_64-linux.tar.gz" "prjquota-$version-x86_64-linux-debug.tar.gz" \
	"prjquota_$version-1_amd64.deb" "prjquota-$version-1.x86_64.rpm" SHA256SUMS SHA256SUMS.asc; do
	cp "$dist/$f" "$out/assets/"
done
gpgv --keyring "$out/site/apt/prjquota-archive-keyring.gpg" "$out/assets/SHA256SUMS.asc" "$out/assets/SHA256SUMS"
(cd "$out/assets" && sha256sum --check --ignore-missing SHA256SUMS)
echo "publish: $tag laid out in $out, signed by $given"
