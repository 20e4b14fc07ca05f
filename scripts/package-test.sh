#!/usr/bin/env bash
# The Debian package, checked without installing it on this machine: built from a given binary,
# its metadata and files read back, the unit verified by systemd-analyze (exposure level too),
# the packaged configuration checked by the packaged binary, the man pages and completions present.
#   scripts/package-test.sh PATH/TO/portico
set -euo pipefail
cd "$(dirname "$0")/.."
bin="${1:?usage: $0 PATH/TO/portico}"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

deb="$(scripts/package-deb.sh --binary "$bin" --out "$work/out" --compress none)"
info="$(dpkg-deb --info "$deb")"
grep -q "Package: portico" <<<"$info"
grep -q "Depends: libc6" <<<"$info"
[ "$(dpkg-deb --ctrl-tarfile "$deb" | tar -xO ./conffiles)" = "/etc/portico/portico.toml" ]

x="$work/root"
dpkg-deb -x "$deb" "$x"
for f in usr/bin/portico etc/portico/portico.toml lib/systemd/system/portico.service \
  lib/systemd/system/portico.socket \
  usr/share/man/man1/portico.1.gz usr/share/man/man1/portico-run.1.gz \
  usr/share/bash-completion/completions/portico usr/share/zsh/vendor-completions/_portico \
  usr/share/fish/vendor_completions.d/portico.fish; do
  [ -s "$x/$f" ] || { echo "package-test: $f missing or empty" >&2; exit 1; }
done
# Stripped: no symbol table left.
if readelf -S "$x/usr/bin/portico" | grep -q '\.symtab'; then
  echo "package-test: usr/bin/portico is not stripped" >&2
  exit 1
fi
# (Whole outputs first: grep -q stopping early would break the pipe under pipefail.)
man_run="$(zcat "$x/usr/share/man/man1/portico-run.1.gz")"
grep -qF 'log\-level' <<<"$man_run"
checked="$("$x/usr/bin/portico" check --config "$x/etc/portico/portico.toml")"
grep -q "configuration OK" <<<"$checked"

# The unit, with its paths pointing into the extracted tree.
unit="$work/portico.service"
sed "s#/usr/bin/portico#$x/usr/bin/portico#g; s#/etc/portico#$x/etc/portico#g" \
  "$x/lib/systemd/system/portico.service" > "$unit"
cp "$x/lib/systemd/system/portico.socket" "$work/portico.socket"
systemd-analyze verify --man=no "$unit" "$work/portico.socket"
exposure="$(systemd-analyze security --offline=yes "$unit" | sed -n 's/.*Overall exposure level for portico.service: \([0-9.]*\).*/\1/p')"
awk -v e="$exposure" 'BEGIN { exit !(e != "" && e <= 2.5) }' || {
  echo "package-test: unit exposure level ${exposure:-unknown} (want <= 2.5)" >&2
  exit 1
}
echo "package-test: $(basename "$deb") OK (unit exposure $exposure)"
